"""NVFP4 casts in Triton, with the ops' signatures and bit-exact numerics (reference/nvfp4.py):
the amax of what is cast, the cast to packed E2M1 codes with E4M3 block scales, and its inverse.

A program takes a [TILE_ROWS, TILE_COLS] tile of what is cast (input, or input^T read through
its strides: never copied), after the random Hadamard transform when asked, and views it as
[TILE_ROWS / block_rows, block_rows, TILE_COLS / 16, 16] blocks (1 x 16, or 16 x 16 tiles).
Zero padding past the edges, as the reference's. Every step is the reference's fp32 operation
in its order, so the codes and scales are the same bits:
- the transform: the sign flips, then butterflies of strides 1, 2, 4, 8 (each a + b, a - b
  rounded in fp32), times 1/4 (exact), rounded to the input's dtype;
- scales: correctly rounded divisions (tl.div_rn), min(., FLT_MAX) and clamps written with
  comparisons (a NaN stays NaN, as torch.minimum's), then the E4M3 conversion (nearest even,
  saturating);
- stochastic rounding: Philox4x32-10 (tl.philox: the reference's rounds, key and constants)
  on the counter (column // 16, row, offset low, offset high), one call per 16 columns whose
  16 bytes go to the columns in order;
- 4over6: both casts of a block, each value's error, summed over the 16 values one at a time
  in their order (each taken out of its block by a sum of itself and zeros: exact), then a
  16 x 16 tile's rows as the reference's tree (r + r + 8, then 4, 2, 1).
The kernels are launched with enable_fp_fusion=False: a product feeding a sum (d * d + error,
a * b - c * d) must be rounded before the sum, as the reference rounds it, not fused into an FMA.

The interpreter (CPU tensors) and GPUs with E4M3 conversion run these; the reference serves the
rest (supports()).
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..reference.nvfp4 import BLOCK, RHT_SIGNS
from ._device import fp8_runs
from ._fp8 import amax_of_partials, magnitude, saturate

FLT_MAX = tl.constexpr(3.4028234663852886e38)
E2M1_MAX = tl.constexpr(6.0)
E4M3_SCALE_MAX = tl.constexpr(448.0)  # the block scales' bound, whatever the global scale's
ONE_SIXTH = tl.constexpr(float(torch.reciprocal(torch.tensor(6.0))))  # fp32(1 / 6), as the reference's
TWO_TO_MINUS_8 = tl.constexpr(2.0 ** -8)
TILE_ROWS, TILE_COLS = 32, 64  # a tile holds whole 16 x 16 blocks
MAX_GRID_COLUMNS = 65535  # CUDA's limit on the second grid dimension (the column tiles)
FOUR_OVER_SIX = {"off": 0, "mae": 1, "mse": 2}
RHT_NEGATIVE_LANES = sum(1 << lane for lane, sign in enumerate(RHT_SIGNS) if sign < 0)  # bit i: lane i flips
_LAUNCH = {"num_warps": 4, "enable_fp_fusion": False}


def _source_view(input: Tensor, transpose: bool) -> Tuple[int, int, int, int]:
    """(rows, cols, row stride, column stride) of what is cast: input, or input^T."""
    if transpose:
        return input.shape[1], input.shape[0], input.stride(1), input.stride(0)
    return input.shape[0], input.shape[1], input.stride(0), input.stride(1)


def _fp32_reciprocal(value: float) -> float:
    """fp32(1 / value), correctly rounded, as the reference's torch.reciprocal of an fp32 value."""
    return float(torch.reciprocal(torch.tensor(value, dtype=torch.float32)))


def supports(op_name: str, args: tuple) -> bool:
    """Every cast whose column tiles the grid holds (up to 4M columns of what is cast); the
    quantize and dequantize casts where the device converts E4M3 (the scales' format)."""
    # nvfp4_amax(input, transpose, ...), nvfp4_quantize(input, amax, block_rows, transpose, ...),
    # nvfp4_dequantize(data, scales, amax, cols, ...)
    if op_name == "nvfp4_dequantize":
        data, cols = args[0], args[3]
        return fp8_runs(data.device, torch.float8_e4m3fn) and triton.cdiv(cols, TILE_COLS) <= MAX_GRID_COLUMNS
    input, transpose = args[0], args[1] if op_name == "nvfp4_amax" else args[3]
    cols = _source_view(input, transpose)[1]
    if triton.cdiv(cols, TILE_COLS) > MAX_GRID_COLUMNS:
        return False
    return op_name == "nvfp4_amax" or fp8_runs(input.device, torch.float8_e4m3fn)


@triton.jit
def _butterfly(x, STRIDE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """One stage of the fast Walsh-Hadamard transform of each 16 values of x's rows: the value
    at lane i (bit STRIDE clear) and its partner at i + STRIDE become a + b and a - b."""
    PAIRS: tl.constexpr = ROWS * COLS // (2 * STRIDE)
    first, second = tl.split(tl.permute(tl.reshape(x, (PAIRS, 2, STRIDE)), (0, 2, 1)))
    return tl.reshape(tl.permute(tl.join(first + second, first - second), (0, 2, 1)), (ROWS, COLS))


@triton.jit
def _hadamard16(x, NEGATIVE_LANES: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """TE's random Hadamard transform (fp32) of each 16 values of x's rows: the fixed signs
    (a flip is exact), butterflies of strides 1, 2, 4, 8, then 1/4 (exact)."""
    lane = tl.arange(0, COLS) % 16
    flips = ((NEGATIVE_LANES >> lane) & 1) != 0
    x = tl.where(flips[None, :], -x, x)
    x = _butterfly(x, 1, ROWS, COLS)
    x = _butterfly(x, 2, ROWS, COLS)
    x = _butterfly(x, 4, ROWS, COLS)
    x = _butterfly(x, 8, ROWS, COLS)
    return x * 0.25


@triton.jit
def _load_source(X, rows, cols, n_rows, n_cols, stride_row, stride_col, RHT: tl.constexpr,
                 NEGATIVE_LANES: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """fp32 [ROWS, COLS] of what is cast at (rows, cols), zeros past the edges; with RHT
    transformed and rounded to the input's dtype, as TE's transform returns it."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None].to(tl.int64) * stride_row + cols[None, :].to(tl.int64) * stride_col
    x = tl.load(X + offsets, mask=mask, other=0.0)
    if RHT:
        x = _hadamard16(x.to(tl.float32), NEGATIVE_LANES, ROWS, COLS).to(X.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def _amax_kernel(X, PARTIALS, n_rows, n_cols, stride_row, stride_col, RHT: tl.constexpr,
                 NEGATIVE_LANES: tl.constexpr, PER_ROW: tl.constexpr, TILE_ROWS: tl.constexpr,
                 TILE_COLS: tl.constexpr):
    """The tile's amax (NaN skipped): PER_ROW, each row's at PARTIALS[column tile, row]; else
    one at PARTIALS[program]. The partials hold no NaN: torch's max reduces them."""
    rows = tl.program_id(0) * TILE_ROWS + tl.arange(0, TILE_ROWS)
    cols = tl.program_id(1) * TILE_COLS + tl.arange(0, TILE_COLS)
    x = _load_source(X, rows, cols, n_rows, n_cols, stride_row, stride_col, RHT, NEGATIVE_LANES, TILE_ROWS, TILE_COLS)
    row_amax = tl.max(magnitude(x), axis=1)
    if PER_ROW:
        tl.store(PARTIALS + tl.program_id(1).to(tl.int64) * n_rows + rows, row_amax, mask=rows < n_rows)
    else:
        tl.store(PARTIALS + tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1),
                 tl.max(row_amax, axis=0))


@triton.jit
def _at_most_flt_max(v):
    """min(v, FLT_MAX), NaN kept (as torch.minimum)."""
    return tl.where(v > FLT_MAX, FLT_MAX, v)


@triton.jit
def _e4m3_scale(v):
    """The fp32 value of e4m3(clamp(v, -448, 448)), rounded to nearest even."""
    return saturate(v, E4M3_SCALE_MAX).to(tl.float8e4nv).to(tl.float32)


@triton.jit
def _global_encode(amax, E4M3_MAX: tl.constexpr):
    """S_enc = min(6 E / g, FLT_MAX), 1 where that is 0 (g = inf)."""
    encode = _at_most_flt_max(tl.div_rn(tl.full(amax.shape, E2M1_MAX * E4M3_MAX, tl.float32), amax))
    return tl.where(encode == 0.0, 1.0, encode)


@triton.jit
def _scaled(blocks, scale, decode_global):
    """blocks [down, rows, across, 16] times each block's encode = min(1 / (scale * S_dec), FLT_MAX)
    (scale [down, across], S_dec [down]), clamped to [-6, 6]."""
    product = scale * decode_global[:, None]
    encode = _at_most_flt_max(tl.div_rn(tl.full(product.shape, 1.0, tl.float32), product))
    return saturate(blocks * encode[:, None, :, None], E2M1_MAX)


@triton.jit
def _e2m1_magnitude(index):
    """The E2M1 grid's index-th value (0, 0.5, 1, 1.5, 2, 3, 4, 6) for int32 index 0..7:
    2^(e - 1) * (1 + m / 2) with e = index >> 1 and m = index & 1, m / 2 where e = 0."""
    exponent = index >> 1
    half_mantissa = (index & 1).to(tl.float32) * 0.5
    power = (1 << exponent).to(tl.float32) * 0.5
    return tl.where(exponent == 0, half_mantissa, power * (1.0 + half_mantissa))


@triton.jit
def _e2m1_value(codes):
    """fp32 values of E2M1 codes (sign in bit 3: code 8 is -0)."""
    codes = codes.to(tl.int32)
    value = _e2m1_magnitude(codes & 7)
    return tl.where((codes & 8) != 0, -value, value)


@triton.jit
def _signed_codes(index, v):
    """uint8 codes: the grid index with v's sign in bit 3 (v < 0: NaN and -0 keep code 0)."""
    return (index | tl.where(v < 0, 8, 0)).to(tl.uint8)


@triton.jit
def _nearest_codes(v):
    """Codes of fp32 values within [-6, 6], nearest with ties to the even code; NaN -> 0. The
    index rises past the ties 0.25, 1.25, 2.5, 5 and from the midpoints 0.75, 1.75, 3.5."""
    m = tl.abs(v)
    index = ((m > 0.25).to(tl.int32) + (m >= 0.75).to(tl.int32) + (m > 1.25).to(tl.int32)
             + (m >= 1.75).to(tl.int32) + (m > 2.5).to(tl.int32) + (m >= 3.5).to(tl.int32) + (m > 5.0).to(tl.int32))
    return _signed_codes(index, v)


@triton.jit
def _random_draws(RNG, rows, ROWS: tl.constexpr, COLS: tl.constexpr):
    """uint32 [ROWS, COLS], each a byte: Philox4x32-10 keyed by the seed RNG[0], one call per 16
    columns with the counter (column // 16, row, offset low, offset high), offset RNG[1];
    column c takes byte c % 4 of word (c % 16) // 4."""
    seed = tl.load(RNG)
    offset = tl.load(RNG + 1).to(tl.uint64, bitcast=True)
    blocks = tl.program_id(1) * (COLS // 16) + tl.arange(0, COLS // 16)  # the tile's columns // 16
    shape: tl.constexpr = (ROWS, COLS // 16)
    block = tl.broadcast_to(blocks[None, :], shape).to(tl.uint32)
    row = tl.broadcast_to(rows[:, None], shape).to(tl.uint32)
    offset_low = tl.full(shape, 0, tl.uint32) + (offset & 0xFFFFFFFF).to(tl.uint32)
    offset_high = tl.full(shape, 0, tl.uint32) + (offset >> 32).to(tl.uint32)
    word0, word1, word2, word3 = tl.philox(seed, block, row, offset_low, offset_high)
    # [ROWS, COLS // 16, 2, 2] -> [ROWS, COLS // 4]: element (j, k) is word 2 j + k of its block.
    words = tl.reshape(tl.join(tl.join(word0, word2), tl.join(word1, word3)), (ROWS, COLS // 4))
    # [ROWS, COLS // 4, 2, 2] -> [ROWS, COLS]: element (j, k) is byte 2 j + k of its word.
    draws = tl.join(tl.join(words & 0xFF, (words >> 16) & 0xFF), tl.join((words >> 8) & 0xFF, words >> 24))
    return tl.reshape(draws, (ROWS, COLS))


@triton.jit
def _stochastic_codes(v, RNG, rows, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Codes of fp32 values within [-6, 6] [ROWS, COLS] (NaN as 0): between grid neighbours
    low <= |v| < high, high where the draw's (byte + 1/2) / 256 < (|v| - low) / (high - low)
    (exact: the difference by Sterbenz's lemma, the division by a power of two)."""
    m = magnitude(v)
    # The grid index at or below |v|, at most 6 (4.0): |v| = 6 is then the fraction 1, always up.
    below = ((m >= 0.5).to(tl.int32) + (m >= 1.0).to(tl.int32) + (m >= 1.5).to(tl.int32) + (m >= 2.0).to(tl.int32)
             + (m >= 3.0).to(tl.int32) + (m >= 4.0).to(tl.int32))
    low, high = _e2m1_magnitude(below), _e2m1_magnitude(below + 1)
    fraction = tl.div_rn(m - low, high - low)
    uniform = (_random_draws(RNG, rows, ROWS, COLS).to(tl.float32) + 0.5) * TWO_TO_MINUS_8
    return _signed_codes(below + (uniform < fraction).to(tl.int32), v)


@triton.jit
def _fold_rows(errors, DOWN: tl.constexpr, HALF: tl.constexpr, ACROSS: tl.constexpr):
    """[DOWN, 2 * HALF, ACROSS] -> [DOWN, HALF, ACROSS]: row r plus row r + HALF."""
    first, second = tl.split(tl.permute(tl.reshape(errors, (DOWN, 2, HALF * ACROSS)), (0, 2, 1)))
    return tl.reshape(first + second, (DOWN, HALF, ACROSS))


@triton.jit
def _tile_sums(row_errors, DOWN: tl.constexpr, ACROSS: tl.constexpr):
    """[DOWN, 16, ACROSS] row errors of 16 x 16 tiles -> [DOWN, 1, ACROSS]: the reference's tree."""
    row_errors = _fold_rows(row_errors, DOWN, 8, ACROSS)
    row_errors = _fold_rows(row_errors, DOWN, 4, ACROSS)
    row_errors = _fold_rows(row_errors, DOWN, 2, ACROSS)
    return _fold_rows(row_errors, DOWN, 1, ACROSS)


@triton.jit
def _block_errors(blocks, codes, scale, amax, encode_global, E4M3_MAX: tl.constexpr, SQUARED: tl.constexpr,
                  SCALED_ERROR: tl.constexpr, DOWN: tl.constexpr, BLOCK_ROWS: tl.constexpr, ACROSS: tl.constexpr):
    """4over6's error of each block [DOWN, ACROSS] of one cast: the sum over its values in their
    order of |d| or d * d (SQUARED), d = ((value * scale) * g) / (6 E) - x, or value * scale -
    x * S_enc (SCALED_ERROR; value * scale is exact: 2-bit by 4-bit significands); a 16 x 16
    tile's row sums added as the reference's tree."""
    decoded = _e2m1_value(codes) * scale[:, None, :, None]
    if SCALED_ERROR:
        d = decoded - blocks * encode_global[:, None, None, None]
    else:
        d = tl.div_rn(decoded * amax[:, None, None, None], tl.full(decoded.shape, E2M1_MAX * E4M3_MAX, tl.float32))
        d = d - blocks
    error = d * d if SQUARED else tl.abs(d)
    lane = tl.arange(0, 16)[None, None, None, :]
    row_errors = tl.sum(tl.where(lane == 0, error, 0.0), axis=3)
    for i in tl.static_range(1, 16):
        row_errors += tl.sum(tl.where(lane == i, error, 0.0), axis=3)
    if BLOCK_ROWS == 16:
        row_errors = _tile_sums(row_errors, DOWN, ACROSS)
    return tl.reshape(row_errors, (DOWN, ACROSS))


@triton.jit
def _four_over_six(blocks, block_amax, amax, encode_global, decode_global, E4M3_MAX: tl.constexpr,
                   SQUARED: tl.constexpr, SCALED_ERROR: tl.constexpr, DOWN: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                   ACROSS: tl.constexpr):
    """(codes, scales) of the cast with the smaller error per block: map-to-4 (scale from
    base * 1.5) or map-to-6 (from base = (block_amax / 6) * S_enc), map-to-6 on a tie or NaN."""
    base = tl.div_rn(block_amax, tl.full(block_amax.shape, E2M1_MAX, tl.float32)) * encode_global[:, None]
    scale4, scale6 = _e4m3_scale(base * 1.5), _e4m3_scale(base)
    codes4 = _nearest_codes(_scaled(blocks, scale4, decode_global))
    codes6 = _nearest_codes(_scaled(blocks, scale6, decode_global))
    error4 = _block_errors(blocks, codes4, scale4, amax, encode_global, E4M3_MAX, SQUARED, SCALED_ERROR, DOWN,
                           BLOCK_ROWS, ACROSS)
    error6 = _block_errors(blocks, codes6, scale6, amax, encode_global, E4M3_MAX, SQUARED, SCALED_ERROR, DOWN,
                           BLOCK_ROWS, ACROSS)
    map_to_4 = error4 < error6
    return tl.where(map_to_4[:, None, :, None], codes4, codes6), tl.where(map_to_4, scale4, scale6)


@triton.jit
def _store_codes(DATA, codes, rows, n_rows, data_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """codes uint8 [ROWS, COLS] packed two per byte, the even column in the low nibble."""
    low, high = tl.split(tl.reshape(codes, (ROWS, COLS // 2, 2)))
    pairs = tl.program_id(1) * (COLS // 2) + tl.arange(0, COLS // 2)
    mask = (rows[:, None] < n_rows) & (pairs[None, :] < data_cols)
    tl.store(DATA + rows[:, None].to(tl.int64) * data_cols + pairs[None, :], low | (high << 4), mask=mask)


@triton.jit
def _store_scales(SCALES, scale, rows, n_rows, scale_cols, DOWN: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                  ACROSS: tl.constexpr):
    """scale [DOWN, ACROSS] as E4M3 (exact: already E4M3 values), on each row of its block."""
    per_row = tl.reshape(tl.broadcast_to(scale[:, None, :], (DOWN, BLOCK_ROWS, ACROSS)), (DOWN * BLOCK_ROWS, ACROSS))
    blocks = tl.program_id(1) * ACROSS + tl.arange(0, ACROSS)
    mask = (rows[:, None] < n_rows) & (blocks[None, :] < scale_cols)
    tl.store(SCALES + rows[:, None].to(tl.int64) * scale_cols + blocks[None, :],
             per_row.to(SCALES.dtype.element_ty), mask=mask)


@triton.jit
def _load_amax(AMAX, rows, n_rows, PER_ROW: tl.constexpr):
    """g for each of rows: its own (PER_ROW), or the tensor's."""
    if PER_ROW:
        return tl.load(AMAX + rows, mask=rows < n_rows, other=1.0)
    return tl.load(AMAX + rows * 0)


@triton.jit
def _quantize_kernel(X, AMAX, RNG, DATA, SCALES, n_rows, n_cols, stride_row, stride_col, data_cols, scale_cols,
                     E4M3_MAX: tl.constexpr, BLOCK_ROWS: tl.constexpr, RHT: tl.constexpr,
                     NEGATIVE_LANES: tl.constexpr, ROW_AMAX: tl.constexpr, STOCHASTIC: tl.constexpr,
                     FOUR_OVER_SIX: tl.constexpr, SCALED_ERROR: tl.constexpr, TILE_ROWS: tl.constexpr,
                     TILE_COLS: tl.constexpr):
    DOWN: tl.constexpr = TILE_ROWS // BLOCK_ROWS
    ACROSS: tl.constexpr = TILE_COLS // 16
    rows = tl.program_id(0) * TILE_ROWS + tl.arange(0, TILE_ROWS)
    cols = tl.program_id(1) * TILE_COLS + tl.arange(0, TILE_COLS)
    x = _load_source(X, rows, cols, n_rows, n_cols, stride_row, stride_col, RHT, NEGATIVE_LANES, TILE_ROWS, TILE_COLS)
    blocks = tl.reshape(x, (DOWN, BLOCK_ROWS, ACROSS, 16))
    block_amax = tl.max(tl.max(magnitude(blocks), axis=3), axis=1)  # [DOWN, ACROSS]
    # A row-scaled cast has 1 x 16 blocks: a block row is a row.
    amax = _load_amax(AMAX, tl.program_id(0) * DOWN + tl.arange(0, DOWN), n_rows, ROW_AMAX)
    encode_global = _global_encode(amax, E4M3_MAX)  # [DOWN]
    decode_global = tl.div_rn(tl.full(encode_global.shape, 1.0, tl.float32), encode_global)
    if FOUR_OVER_SIX == 0:
        scale = _e4m3_scale(_at_most_flt_max(block_amax * (encode_global * ONE_SIXTH)[:, None]))
        scaled = tl.reshape(_scaled(blocks, scale, decode_global), (TILE_ROWS, TILE_COLS))
        if STOCHASTIC:
            codes = _stochastic_codes(scaled, RNG, rows, TILE_ROWS, TILE_COLS)
        else:
            codes = _nearest_codes(scaled)
    else:
        codes, scale = _four_over_six(blocks, block_amax, amax, encode_global, decode_global, E4M3_MAX,
                                      FOUR_OVER_SIX == 2, SCALED_ERROR, DOWN, BLOCK_ROWS, ACROSS)
        codes = tl.reshape(codes, (TILE_ROWS, TILE_COLS))
    _store_codes(DATA, codes, rows, n_rows, data_cols, TILE_ROWS, TILE_COLS)
    _store_scales(SCALES, scale, rows, n_rows, scale_cols, DOWN, BLOCK_ROWS, ACROSS)


@triton.jit
def _dequantize_kernel(DATA, SCALES, AMAX, Y, n_rows, n_cols, inverse_range,
                       ROW_AMAX: tl.constexpr, TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr):
    """Y = code * ((scale * g) * fp32(1 / (6 E))) in fp32 (inverse_range the last factor), one
    rounding to Y's dtype."""
    ACROSS: tl.constexpr = TILE_COLS // 16
    rows = tl.program_id(0) * TILE_ROWS + tl.arange(0, TILE_ROWS)
    pairs = tl.program_id(1) * (TILE_COLS // 2) + tl.arange(0, TILE_COLS // 2)
    blocks = tl.program_id(1) * ACROSS + tl.arange(0, ACROSS)
    data_cols, scale_cols = tl.cdiv(n_cols, 2), tl.cdiv(n_cols, 16)
    row_ok = rows[:, None] < n_rows
    packed = tl.load(DATA + rows[:, None].to(tl.int64) * data_cols + pairs[None, :],
                     mask=row_ok & (pairs[None, :] < data_cols), other=0)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (TILE_ROWS, TILE_COLS))
    scale = tl.load(SCALES + rows[:, None].to(tl.int64) * scale_cols + blocks[None, :],
                    mask=row_ok & (blocks[None, :] < scale_cols), other=0.0).to(tl.float32)
    factor = (scale * _load_amax(AMAX, rows, n_rows, ROW_AMAX)[:, None]) * inverse_range  # [TILE_ROWS, ACROSS]
    values = tl.reshape(_e2m1_value(codes), (TILE_ROWS, ACROSS, 16)) * factor[:, :, None]
    cols = tl.program_id(1) * TILE_COLS + tl.arange(0, TILE_COLS)
    tl.store(Y + rows[:, None].to(tl.int64) * n_cols + cols[None, :],
             tl.reshape(values, (TILE_ROWS, TILE_COLS)).to(Y.dtype.element_ty), mask=row_ok & (cols[None, :] < n_cols))


def _grid(rows: int, cols: int) -> Tuple[int, int]:
    return triton.cdiv(rows, TILE_ROWS), triton.cdiv(cols, TILE_COLS)


def nvfp4_amax(input: Tensor, transpose: bool, rht: bool, per_row: bool = False) -> Tensor:
    rows, cols, stride_row, stride_col = _source_view(input, transpose)
    if not (rows and cols):
        return torch.zeros(rows if per_row else 1, dtype=torch.float32, device=input.device)
    grid = _grid(rows, cols)
    partials = torch.empty(grid[1] * rows if per_row else grid[0] * grid[1], dtype=torch.float32, device=input.device)
    _amax_kernel[grid](input, partials, rows, cols, stride_row, stride_col, RHT=rht,
                       NEGATIVE_LANES=RHT_NEGATIVE_LANES, PER_ROW=per_row, TILE_ROWS=TILE_ROWS, TILE_COLS=TILE_COLS,
                       **_LAUNCH)
    if per_row:
        return partials.view(grid[1], rows).amax(dim=0)
    return amax_of_partials(partials).reshape(1)


def nvfp4_quantize(input: Tensor, amax: Tensor, block_rows: int, transpose: bool, rht: bool,
                   sr_rng: Optional[Tensor], e4m3_max: int = 448, four_over_six: str = "off",
                   scaled_error: bool = False) -> Tuple[Tensor, Tensor]:
    rows, cols, stride_row, stride_col = _source_view(input, transpose)
    data = torch.empty((rows, triton.cdiv(cols, 2)), dtype=torch.uint8, device=input.device)
    scales = torch.empty((rows, triton.cdiv(cols, BLOCK)), dtype=torch.float8_e4m3fn, device=input.device)
    if rows and cols:
        amax = amax.contiguous()
        rng = sr_rng.contiguous() if sr_rng is not None else amax  # read only with STOCHASTIC
        _quantize_kernel[_grid(rows, cols)](
            input, amax, rng, data, scales, rows, cols, stride_row, stride_col, data.shape[1], scales.shape[1],
            E4M3_MAX=e4m3_max, BLOCK_ROWS=block_rows, RHT=rht, NEGATIVE_LANES=RHT_NEGATIVE_LANES,
            ROW_AMAX=amax.numel() > 1, STOCHASTIC=sr_rng is not None, FOUR_OVER_SIX=FOUR_OVER_SIX[four_over_six],
            SCALED_ERROR=scaled_error, TILE_ROWS=TILE_ROWS, TILE_COLS=TILE_COLS, **_LAUNCH)
    return data, scales


def nvfp4_dequantize(data: Tensor, scales: Tensor, amax: Tensor, cols: int, out_dtype: torch.dtype,
                     e4m3_max: int = 448) -> Tensor:
    rows = data.shape[0]
    output = torch.empty((rows, cols), dtype=out_dtype, device=data.device)
    if rows and cols:
        data, scales, amax = data.contiguous(), scales.contiguous(), amax.contiguous()
        _dequantize_kernel[_grid(rows, cols)](
            data, scales, amax, output, rows, cols, _fp32_reciprocal(6.0 * e4m3_max), ROW_AMAX=amax.numel() > 1,
            TILE_ROWS=TILE_ROWS, TILE_COLS=TILE_COLS, **_LAUNCH)
    return output
