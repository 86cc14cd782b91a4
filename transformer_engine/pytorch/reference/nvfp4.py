"""NVFP4 casts in plain PyTorch, with the ops' signatures and semantics (TE's NVFP4BlockScaling).

An NVFP4 tensor [rows, cols] holds 4-bit E2M1 codes (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
their negatives), two per byte (the even column in the low nibble), a float8_e4m3fn scale per
block of 16 consecutive values of a row (block_rows = 1) or per 16 x 16 tile (block_rows = 16,
TE's 2-D weight blocks; the tile's scale is stored on each of its 16 rows), and an fp32 amax g
for the whole tensor, or one per row (TE's row-scaled NVFP4). With E the global scale's E4M3
bound (448; TE's 4over6 tensors may use 256), fp32 arithmetic throughout:

    S_enc   = min(E * 6 / g, FLT_MAX), 1 where that is 0 (g = inf); S_dec = 1 / S_enc
    scale   = e4m3(clamp(min(block_amax * (S_enc * (1 / 6)), FLT_MAX), -448, 448))   (nearest even)
    encode  = min(1 / (scale * S_dec), FLT_MAX)
    code    = e2m1(clamp(x * encode, -6, 6))          (nearest, ties to the even code)
    value   = code * (scale * g * (1 / (6 * E))) in fp32, then converted to the output dtype (as TE's)

block_amax skips NaN (the package's amax rule); a NaN element gets code +0, a negative value
that rounds to zero -0 (code 8). Ragged edges are padded with zeros to whole blocks; the codes
and scales of the padding are not returned.

4over6 (TE's adaptive block scaling, four_over_six "mae" or "mse") casts each block twice and
keeps the cast with the smaller error, map-to-6 on a tie (or a NaN error):
    base    = (block_amax / 6) * S_enc
    map-to-6: scale = e4m3(clamp(base, -448, 448));  map-to-4: scale = e4m3(clamp(base * 1.5, -448, 448))
(map-to-4's largest value lands on the code 4, whose neighbours are closer), each cast with its
own encode as above. A block's error is the sum over its 16 values, in their order, of |d|
("mae") or d * d ("mse"), with d = ((value_code * scale) * g) / (6 * E) - x, or with
scaled_error (TE's fast-math error) d = value_code * scale - x * S_enc. A 16 x 16 tile sums
its 16 row errors as a tree: row r + row r + 8, then + 4, + 2, + 1.

Options of the cast (nvfp4_quantize; nvfp4_amax takes the first two, so that the amax is that
of exactly what is cast):
- transpose: cast input^T (the column-wise usage, for the GEMMs that contract the rows);
- rht: TE's random Hadamard transform first, on each 16 consecutive values of a row (cols a
  multiple of 16): y = (x * signs) H / 4 with H the 16 x 16 Sylvester Hadamard matrix and TE's
  fixed signs, computed as a fast Walsh-Hadamard transform in fp32 (butterflies of strides 1, 2,
  4, 8, each a + b then a - b), times 1/4, rounded to the input's dtype (as TE's transform
  returns it);
- sr_rng (int64 [2]: seed, offset): stochastic rounding of the codes: |x * encode| between
  grid neighbours lo < |v| < hi rounds to hi with probability (|v| - lo) / (hi - lo) rounded to
  a multiple of 1/256. Each value draws 8 random bits, as TE's conversion takes one 32-bit word
  for every 4 values: one Philox call keyed by the seed per 16 values of a row, counter
  (column // 16, row, offset low, offset high); column c takes byte c % 4 (bits 8 (c % 4) up)
  of word (c % 16) // 4, and goes up when (byte + 1/2) / 256 is below that fraction (fp32: the
  fraction is exact, hi - lo being a power of two and |v| - lo exact). Not with 4over6.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scaling import amax as amax_over
from .philox import MASK32, philox4x32

BLOCK = 16
E2M1_MAX, E4M3_MAX = 6.0, 448.0
FLT_MAX = torch.finfo(torch.float32).max
# TE's fixed signs of the random Hadamard transform (get_wgrad_sign_vector).
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Magnitudes past which the code rises: ties (0.25, 1.25, 2.5, 5) stay on the even code below,
# the others (0.75, 1.75, 3.5) go up to the even code above.
_UP_ABOVE = (0.25, 1.25, 2.5, 5.0)
_UP_FROM = (0.75, 1.75, 3.5)


def _f32(value: float) -> Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _walsh_hadamard(y: Tensor) -> Tensor:
    """y [blocks, 16] fp32 times the Sylvester Hadamard matrix H (symmetric): butterflies of
    strides 1, 2, 4, 8, each a + b then a - b."""
    for stride in (1, 2, 4, 8):
        pairs = y.reshape(-1, BLOCK // (2 * stride), 2, stride)  # [blocks, pairs, (a, b), stride]
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack([a + b, a - b], dim=2).reshape(-1, BLOCK)
    return y


def _signs(device: torch.device) -> Tensor:
    return torch.tensor(RHT_SIGNS, dtype=torch.float32, device=device)


def _check_rht_width(name: str, x: Tensor) -> None:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"{name}: the last dimension ({x.shape[-1]}) must be a multiple of {BLOCK}")


def rht16(x: Tensor) -> Tensor:
    """The random Hadamard transform of each 16 values along the last dimension (see above)."""
    _check_rht_width("rht16", x)
    y = _walsh_hadamard(x.float().reshape(-1, BLOCK) * _signs(x.device))  # [blocks, 16]
    return (y * 0.25).reshape(x.shape).to(x.dtype)


def inverse_rht16(y: Tensor) -> Tensor:
    """rht16's inverse in fp32 (its matrix diag(signs) H / 4 is orthogonal: the inverse is
    H diag(signs) / 4), for the values of a transformed tensor's codes."""
    _check_rht_width("inverse_rht16", y)
    x = _walsh_hadamard(y.float().reshape(-1, BLOCK)) * _signs(y.device) * 0.25  # [blocks, 16]
    return x.reshape(y.shape)


def _source(input: Tensor, transpose: bool, rht: bool) -> Tensor:
    """What is cast: input (or input^T) [rows, cols], after the transform when rht."""
    source = input.t() if transpose else input
    return rht16(source) if rht else source


def nvfp4_amax(input: Tensor, transpose: bool, rht: bool, per_row: bool = False) -> Tensor:
    """fp32 [1]: max |x| of what nvfp4_quantize(input, ..., transpose, rht) casts (NaN skipped);
    per_row: fp32 [rows], each row's (row-scaled NVFP4)."""
    source = _source(input, transpose, rht)
    if per_row:
        return amax_over(source, dim=1).float()
    return amax_over(source).reshape(1).float()


FOUR_OVER_SIX = ("off", "mae", "mse")


def global_scales(amax: Tensor, e4m3_max: int = 448) -> Tuple[Tensor, Tensor]:
    """(S_enc, S_dec) fp32, each of amax's shape ([1], or [rows] for a row-scaled cast)."""
    encode = torch.minimum(_f32(float(e4m3_max) * E2M1_MAX) / amax.float(), _f32(FLT_MAX))
    encode = torch.where(encode == 0, torch.ones_like(encode), encode)
    return encode, torch.reciprocal(encode)


def e2m1_codes(v: Tensor) -> Tensor:
    """uint8 codes (sign in bit 3) of fp32 values already within [-6, 6], nearest even; NaN -> 0."""
    magnitude = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for bound in _UP_ABOVE:
        code += (magnitude > bound).to(torch.uint8)
    for bound in _UP_FROM:
        code += (magnitude >= bound).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)


def e2m1_values(codes: Tensor) -> Tensor:
    """fp32 values of uint8 codes (low 4 bits)."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    return table[codes.long() & 0xF]


def _stochastic_codes(v: Tensor, rng: Tensor) -> Tensor:
    """Codes of fp32 values within [-6, 6] [rows, cols], rounded stochastically (see above)."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=v.device)
    magnitude = v.abs().nan_to_num(0.0)
    below = (torch.bucketize(magnitude.contiguous(), grid, right=True) - 1).clamp(0, 6)  # grid index at or below
    lo, hi = grid[below], grid[below + 1]
    fraction = (magnitude - lo) / (hi - lo)
    rows, cols = v.shape
    seed, offset = (int(t) for t in rng.tolist())
    row = torch.arange(rows, dtype=torch.int64, device=v.device).view(rows, 1).expand(rows, cols)
    column = torch.arange(cols, dtype=torch.int64, device=v.device).view(1, cols).expand(rows, cols)
    counter = torch.stack([column // 16, row, torch.full_like(row, offset & MASK32),
                           torch.full_like(row, (offset >> 32) & MASK32)], dim=-1)
    word = philox4x32(counter, seed).gather(-1, (column % 16 // 4).unsqueeze(-1)).squeeze(-1)
    draw = (word >> (8 * (column % 4))) & 0xFF
    up = (draw.to(torch.float32) + 0.5) * 2.0 ** -8 < fraction
    code = (below + up.long()).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)


def pack_codes(codes: Tensor) -> Tensor:
    """uint8 codes [rows, cols] -> bytes [rows, ceil(cols / 2)], the even column in the low nibble."""
    if codes.shape[1] % 2:
        codes = F.pad(codes, (0, 1))
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_codes(data: Tensor, cols: int) -> Tensor:
    """bytes [rows, ceil(cols / 2)] -> uint8 codes [rows, cols]."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], 2 * data.shape[1])[:, :cols]


def _check_options(block_rows: int, four_over_six: str, sr_rng: Optional[Tensor], e4m3_max: int) -> None:
    if block_rows not in (1, BLOCK):
        raise ValueError(f"nvfp4_quantize: block_rows must be 1 or {BLOCK}, got {block_rows}")
    if four_over_six not in FOUR_OVER_SIX:
        raise ValueError(f"nvfp4_quantize: four_over_six must be one of {FOUR_OVER_SIX}, got {four_over_six!r}")
    if four_over_six != "off" and sr_rng is not None:
        raise ValueError("nvfp4_quantize: 4over6 picks each block's nearest cast; it takes no sr_rng")
    if e4m3_max not in (448, 256):
        raise ValueError(f"nvfp4_quantize: e4m3_max must be 448 or 256, got {e4m3_max}")


def _e4m3_scales(decode: Tensor) -> Tensor:
    return decode.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _scaled(blocks: Tensor, scales: Tensor, decode_global: Tensor) -> Tensor:
    """blocks [grid_rows, block_rows, grid_cols, 16] times each block's encode, within [-6, 6]."""
    encode = torch.minimum(torch.reciprocal(scales.float() * decode_global), _f32(FLT_MAX))  # [grid_rows, grid_cols]
    return (blocks * encode[:, None, :, None]).clamp(-E2M1_MAX, E2M1_MAX)


def _block_errors(blocks: Tensor, codes: Tensor, scales: Tensor, amax: Tensor, encode_global: Tensor,
                  e4m3_max: int, squared: bool, scaled_error: bool) -> Tensor:
    """4over6's error of each block of one cast [grid_rows, grid_cols] (see the module's
    docstring): blocks and codes [grid_rows, block_rows, grid_cols, 16], scales and the global
    amax / S_enc [grid_rows, grid_cols] or broadcastable, fp32 sums in the values' order."""
    scale = scales.float()[:, None, :]  # [grid_rows, 1, grid_cols]
    decoded = e2m1_values(codes)
    if scaled_error:
        differences = decoded * scale[..., None] - blocks * encode_global[:, None, :, None]
    else:
        differences = (decoded * scale[..., None]) * amax[:, None, :, None] / _f32(6.0 * e4m3_max) - blocks
    row_errors = torch.zeros(blocks.shape[:3], dtype=torch.float32, device=blocks.device)
    for i in range(BLOCK):
        d = differences[..., i]
        row_errors = row_errors + (d * d if squared else d.abs())
    while row_errors.shape[1] > 1:  # a tile's rows: r + (r + half), halving
        half = row_errors.shape[1] // 2
        row_errors = row_errors[:, :half] + row_errors[:, half:]
    return row_errors[:, 0]


def nvfp4_quantize(input: Tensor, amax: Tensor, block_rows: int, transpose: bool, rht: bool,
                   sr_rng: Optional[Tensor], e4m3_max: int = 448, four_over_six: str = "off",
                   scaled_error: bool = False) -> Tuple[Tensor, Tensor]:
    """(data uint8 [rows, ceil(cols / 2)], scales float8_e4m3fn [rows, ceil(cols / 16)]) of
    input [rows, cols] (or its transpose), with the tensor's amax (fp32 [1]: nvfp4_amax's, or
    reduced over ranks) or each row's (fp32 [rows], block_rows 1: row-scaled)."""
    _check_options(block_rows, four_over_six, sr_rng, e4m3_max)
    source = _source(input, transpose, rht).float()
    rows, cols = source.shape
    if amax.numel() not in (1, rows) or (amax.numel() == rows != 1 and block_rows != 1):
        raise ValueError(f"nvfp4_quantize: amax must hold 1 value or, with block_rows 1, one per row ({rows}); "
                         f"got {amax.numel()}")
    grid_rows, grid_cols = -(-rows // block_rows), -(-cols // BLOCK)
    padded = F.pad(source, (0, grid_cols * BLOCK - cols, 0, grid_rows * block_rows - rows))
    blocks = padded.reshape(grid_rows, block_rows, grid_cols, BLOCK)
    block_amax = amax_over(blocks, dim=(1, 3))  # [grid_rows, grid_cols]
    per_block = (-1, 1) if amax.numel() > 1 else (1, 1)
    g = amax.float().reshape(per_block)  # [grid_rows | 1, 1]
    encode_global, decode_global = global_scales(g, e4m3_max)
    if four_over_six == "off":
        multiplier = encode_global * torch.reciprocal(_f32(E2M1_MAX))
        scales = _e4m3_scales(torch.minimum(block_amax * multiplier, _f32(FLT_MAX)))  # [grid_rows, grid_cols]
        scaled = _scaled(blocks, scales, decode_global)
        codes = e2m1_codes(scaled) if sr_rng is None else _stochastic_codes(scaled.reshape(padded.shape), sr_rng)
        codes = codes.reshape(blocks.shape)
    else:
        base = (block_amax / _f32(E2M1_MAX)) * encode_global
        candidates = []
        for scales in (_e4m3_scales(base * 1.5), _e4m3_scales(base)):  # map-to-4, map-to-6
            codes = e2m1_codes(_scaled(blocks, scales, decode_global))
            error = _block_errors(blocks, codes, scales, g, encode_global, e4m3_max, four_over_six == "mse",
                                  scaled_error)
            candidates.append((codes, scales, error))
        (codes4, scales4, error4), (codes6, scales6, error6) = candidates
        map_to_4 = error4 < error6  # [grid_rows, grid_cols]; a tie or NaN keeps map-to-6
        codes = torch.where(map_to_4[:, None, :, None], codes4, codes6)
        scales = torch.where(map_to_4, scales4.view(torch.uint8), scales6.view(torch.uint8)).view(torch.float8_e4m3fn)
    per_row = scales.repeat_interleave(block_rows, dim=0)[:rows]  # the tile's scale on each of its rows
    return pack_codes(codes.reshape(padded.shape)[:rows, :cols]), per_row.contiguous()


def nvfp4_dequantize(data: Tensor, scales: Tensor, amax: Tensor, cols: int, out_dtype: torch.dtype,
                     e4m3_max: int = 448) -> Tensor:
    """The values [rows, cols] in out_dtype of codes data [rows, ceil(cols / 2)] with scales
    [rows, ceil(cols / 16)] and the tensor's amax (fp32 [1]) or each row's ([rows])."""
    g = amax.float().reshape(-1, 1)  # [rows | 1, 1]
    factor = scales.float() * g * torch.reciprocal(_f32(6.0 * e4m3_max))  # [rows, blocks]
    per_value = factor.repeat_interleave(BLOCK, dim=1)[:, :cols]
    return (e2m1_values(unpack_codes(data, cols)) * per_value).to(out_dtype)


def nvfp4_transpose_tiles(data: Tensor, scales: Tensor, cols: int) -> Tuple[Tensor, Tensor]:
    """The column-wise usage (data [cols, ceil(rows / 2)], scales [cols, ceil(rows / 16)]) of a
    16 x 16-tile cast (nearest, no transform, no 4over6) from its row-wise data [rows,
    ceil(cols / 2)] and scales [rows, ceil(cols / 16)]: both usages cast the same tiles with
    the same amax, so the transpose's codes are the codes transposed and its scales the tiles'."""
    transposed = pack_codes(unpack_codes(data, cols).t().contiguous())  # [cols, ceil(rows / 2)]
    tiles = scales.view(torch.uint8)[::BLOCK]  # [ceil(rows / 16), ceil(cols / 16)]: each tile row's scales
    per_row = tiles.t().repeat_interleave(BLOCK, dim=0)[:cols]  # [cols, ceil(rows / 16)]
    return transposed, per_row.contiguous().view(torch.float8_e4m3fn)


def nvfp4_gemm(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor, k: int, alpha: Tensor,
               row_scales: Optional[Tensor], col_scales: Optional[Tensor], bias: Optional[Tensor],
               out_dtype: torch.dtype) -> Tensor:
    """a @ b^T [m, n] for a [m, k], b [n, k] as packed codes with their E4M3 scales per 16 along
    k: each value code * scale (exact in fp32), fp32 sums, then in fp32 times alpha (fp32 [1]),
    times row_scales[i] * col_scales[j] where given (row-scaled operands; a missing one is 1),
    plus bias, one rounding to out_dtype."""
    unit = torch.full((1,), 6.0 * E4M3_MAX, dtype=torch.float32, device=a_data.device)  # factor = the scale
    a = nvfp4_dequantize(a_data, a_scales, unit, k, torch.float32)
    b = nvfp4_dequantize(b_data, b_scales, unit, k, torch.float32)
    return gemm_epilogue((a @ b.t()) * alpha.float(), row_scales, col_scales, bias, out_dtype)


def nvfp4_gemm_accumulate(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor, k: int, alpha: Tensor,
                          out: Tensor) -> None:
    """out += alpha * (a @ b^T) in place, out's values added in fp32 before the one rounding
    (nvfp4_gemm's operands; a weight gradient added into main_grad)."""
    sums = nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, None, None, None, torch.float32)
    out.copy_((sums + out.float()).to(out.dtype))


def gemm_epilogue(scaled: Tensor, row_scales: Optional[Tensor], col_scales: Optional[Tensor], bias: Optional[Tensor],
                  out_dtype: torch.dtype) -> Tensor:
    """TE's NVFP4 epilogue after alpha, in fp32: scaled [m, n] times row_scales[i] * col_scales[j]
    where given (a missing one is 1), plus bias, one rounding to out_dtype."""
    out = scaled
    if row_scales is not None or col_scales is not None:
        rows = row_scales.float().view(-1, 1) if row_scales is not None else torch.ones(1, 1, device=out.device)
        cols = col_scales.float().view(1, -1) if col_scales is not None else torch.ones(1, 1, device=out.device)
        out = out * (rows * cols)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
