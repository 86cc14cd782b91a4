"""Block-scaled FP8 casts in Triton, with the ops' signatures and numerics (reference/fp8_block.py):
one scale per block_rows x block_cols block of a 2-D input (1x128 and 128x128 as in TE's block
scaling, 1x32 with E8M0 exponents as in MXFP8, and their column-wise forms 128x1, 32x1).

A program takes a [TILE_ROWS, TILE_COLS] tile holding whole blocks, views it as
[TILE_ROWS / block_rows, block_rows, TILE_COLS / block_cols, block_cols], reduces each block's
amax (NaN skipped, inf counted, zero padding past the edges), computes the scale in float32
exactly as scaling.py does (a correctly rounded quotient fp8_max / max(amax, amax_epsilon);
'pow2' keeps its exponent bits; 'e8m0' the biased exponent of amax * fp32(1 / fp8_max), rounded
up) and writes the saturated codes and one scale_inv per block. Block sides must be powers of
two with a block of at most 16384 elements; the reference serves other shapes.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._device import fp8_runs
from ._fp8 import e8m0_to_float, fp8_max, magnitude, saturate

FLT_MAX = tl.constexpr(3.4028234663852886e38)
_MODES = {"fp32": 0, "pow2": 1, "e8m0": 2}
_TILE_ELEMENTS = 4096  # a tile holds at least this many elements (or one block, when larger)
_MAX_BLOCK_ELEMENTS = 16384
_MAX_GRID_COLUMNS = 65535


def _tile(block_rows: int, block_cols: int) -> Tuple[int, int]:
    cols = max(block_cols, 128)
    return max(block_rows, _TILE_ELEMENTS // cols), cols


def _is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def supports(op_name: str, args: tuple) -> bool:
    """Power-of-two block sides, blocks of at most 16384 elements, rows the grid can tile, an FP8
    format the device converts."""
    # fp8_block_quantize(input, block_rows, block_cols, fp8_dtype, ...),
    # fp8_block_dequantize(data, scale_inv, block_rows, block_cols, ...)
    quantize = op_name == "fp8_block_quantize"
    first_block_arg = 1 if quantize else 2
    tensor, (block_rows, block_cols) = args[0], args[first_block_arg:first_block_arg + 2]
    if not fp8_runs(tensor.device, args[3] if quantize else tensor.dtype):
        return False
    if not (_is_power_of_2(block_rows) and _is_power_of_2(block_cols)):
        return False
    tile_cols = _tile(block_rows, block_cols)[1]
    return (block_rows * block_cols <= _MAX_BLOCK_ELEMENTS
            and triton.cdiv(tensor.shape[1], tile_cols) <= _MAX_GRID_COLUMNS)


@triton.jit
def _block_quantize_kernel(X, Y, SCALE_INV, n_rows, n_cols, grid_rows, grid_cols, amax_epsilon, e8m0_reciprocal,
                           FP8_MAX: tl.constexpr, MODE: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                           BLOCK_COLS: tl.constexpr, TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr):
    BLOCKS_DOWN: tl.constexpr = TILE_ROWS // BLOCK_ROWS
    BLOCKS_ACROSS: tl.constexpr = TILE_COLS // BLOCK_COLS
    rows = tl.program_id(0) * TILE_ROWS + tl.arange(0, TILE_ROWS)
    cols = tl.program_id(1) * TILE_COLS + tl.arange(0, TILE_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    # [TILE_ROWS, TILE_COLS] -> [BLOCKS_DOWN, BLOCK_ROWS, BLOCKS_ACROSS, BLOCK_COLS]
    blocks = tl.reshape(x, (BLOCKS_DOWN, BLOCK_ROWS, BLOCKS_ACROSS, BLOCK_COLS))
    amax = tl.max(tl.max(magnitude(blocks), axis=3), axis=1)  # [BLOCKS_DOWN, BLOCKS_ACROSS]
    if MODE == 2:
        # E8M0: the biased exponent of amax / fp8_max, plus one where mantissa bits remain
        # (a subnormal value up to 2^-127 keeps exponent 0); inf gives 254.
        bits = (amax * e8m0_reciprocal).to(tl.int32, bitcast=True)
        exponent = (bits >> 23) & 0xFF
        mantissa = bits & 0x7FFFFF
        round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
        exponent = tl.where(exponent == 0xFF, 0xFE, exponent + round_up.to(tl.int32))
        scale = tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), e8m0_to_float(exponent))
        scale_inv = exponent.to(tl.uint8)
    else:
        bounded = tl.maximum(amax, amax_epsilon)
        scale = tl.div_rn(tl.full(amax.shape, FP8_MAX, tl.float32), bounded)
        scale = tl.where(scale == float("inf"), FLT_MAX, scale)
        scale = tl.where((bounded > 0.0) & (bounded < float("inf")), scale, 1.0)
        if MODE == 1:
            scale = (scale.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
        scale_inv = tl.div_rn(tl.full(amax.shape, 1.0, tl.float32), scale)
    scaled = blocks * scale[:, None, :, None]
    codes = tl.reshape(saturate(scaled, FP8_MAX), (TILE_ROWS, TILE_COLS)).to(Y.dtype.element_ty)
    tl.store(Y + offsets, codes, mask=mask)
    block_rows = tl.program_id(0) * BLOCKS_DOWN + tl.arange(0, BLOCKS_DOWN)
    block_cols = tl.program_id(1) * BLOCKS_ACROSS + tl.arange(0, BLOCKS_ACROSS)
    tl.store(SCALE_INV + block_rows[:, None].to(tl.int64) * grid_cols + block_cols[None, :], scale_inv,
             mask=(block_rows[:, None] < grid_rows) & (block_cols[None, :] < grid_cols))


@triton.jit
def _block_dequantize_kernel(X, SCALE_INV, Y, n_rows, n_cols, grid_cols, E8M0: tl.constexpr,
                             BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, TILE_ROWS: tl.constexpr,
                             TILE_COLS: tl.constexpr):
    rows = tl.program_id(0) * TILE_ROWS + tl.arange(0, TILE_ROWS)
    cols = tl.program_id(1) * TILE_COLS + tl.arange(0, TILE_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    # Each element's block scale: a gathered load, served from cache after its block's first.
    scale_offsets = (rows // BLOCK_ROWS)[:, None].to(tl.int64) * grid_cols + (cols // BLOCK_COLS)[None, :]
    factor = tl.load(SCALE_INV + scale_offsets, mask=mask, other=0)
    if E8M0:
        factor = e8m0_to_float(factor.to(tl.int32))
    tl.store(Y + offsets, (x * factor).to(Y.dtype.element_ty), mask=mask)


def _grid(shape, tile: Tuple[int, int]) -> Tuple[int, int]:
    return triton.cdiv(shape[0], tile[0]), triton.cdiv(shape[1], tile[1])


def fp8_block_quantize(input: Tensor, block_rows: int, block_cols: int, fp8_dtype: torch.dtype, scale_mode: str,
                       amax_epsilon: float) -> Tuple[Tensor, Tensor]:
    x = input.contiguous()
    n_rows, n_cols = x.shape
    grid_rows, grid_cols = triton.cdiv(n_rows, block_rows), triton.cdiv(n_cols, block_cols)
    data = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    scale_dtype = torch.uint8 if scale_mode == "e8m0" else torch.float32
    scale_inv = torch.empty((grid_rows, grid_cols), dtype=scale_dtype, device=x.device)
    tile = _tile(block_rows, block_cols)
    if x.numel():
        fp8_top = fp8_max(fp8_dtype)
        _block_quantize_kernel[_grid(x.shape, tile)](
            x, data, scale_inv, n_rows, n_cols, grid_rows, grid_cols, float(amax_epsilon),
            float(torch.tensor(1.0 / fp8_top, dtype=torch.float32)), FP8_MAX=fp8_top, MODE=_MODES[scale_mode],
            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, TILE_ROWS=tile[0], TILE_COLS=tile[1], num_warps=8)
    return data, scale_inv


def fp8_block_dequantize(data: Tensor, scale_inv: Tensor, block_rows: int, block_cols: int,
                         out_dtype: torch.dtype) -> Tensor:
    x = data.contiguous()
    output = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    tile = _tile(block_rows, block_cols)
    if x.numel():
        _block_dequantize_kernel[_grid(x.shape, tile)](
            x, scale_inv.contiguous(), output, x.shape[0], x.shape[1], scale_inv.shape[1],
            E8M0=scale_inv.dtype == torch.uint8, BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, TILE_ROWS=tile[0],
            TILE_COLS=tile[1], num_warps=8)
    return output
