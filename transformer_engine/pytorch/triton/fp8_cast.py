"""Per-tensor FP8 casts in Triton, with the ops' signatures and numerics (reference/fp8_cast.py):
data = saturate(input * scale) rounded to nearest even, the product in float32; amax =
max |input| with NaN skipped and inf counted; dequantize = data * scale_inv in float32, one
rounding to out_dtype.

fp8_quantize: a program casts BLOCK consecutive elements and writes its partial amax; the
partials (no NaN among them) are reduced by a second, fixed-order max. fp8_quantize_transpose:
a program casts a [TILE, TILE] tile of input viewed as [M, N] and writes its codes twice, the
second time transposed (Triton stages the transpose through shared memory, so both stores
are coalesced).
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..reference import fp8_cast as reference_fp8_cast
from ._device import fp8_runs
from ._fp8 import amax_of_partials, fp8_max, magnitude, saturate

BLOCK = 4096  # elements per program of the elementwise kernels
TILE = 64  # the transposing kernel's square tile


MAX_GRID_COLUMNS = 65535  # CUDA's limit on the second grid dimension


def supports(op_name: str, args: tuple) -> bool:
    """The arguments the checks (custom_ops/_fp8_checks.py) let through (16/32-bit floats, both FP8
    formats) where the device converts that format, except a transposing cast of rows longer
    than the grid can tile (over 4M)."""
    fp8_dtype = {"fp8_dequantize": args[0].dtype, "fp8_quantize_current": args[1],
                 "fp8_quantize_delayed_": args[-1]}.get(op_name) or args[2]
    if not fp8_runs(args[0].device, fp8_dtype):
        return False
    if op_name == "fp8_quantize_transpose":
        return triton.cdiv(args[0].shape[-1], TILE) <= MAX_GRID_COLUMNS
    return True


@triton.jit
def _quantize_kernel(X, SCALE, Y, AMAX_PARTIAL, n, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    codes = saturate(x * tl.load(SCALE), FP8_MAX).to(Y.dtype.element_ty)
    tl.store(Y + offsets, codes, mask=mask)
    tl.store(AMAX_PARTIAL + tl.program_id(0), tl.max(magnitude(x), axis=0))


@triton.jit
def _quantize_transpose_kernel(X, SCALE, Y, Y_T, AMAX_PARTIAL, n_rows, n_cols, FP8_MAX: tl.constexpr,
                               TILE: tl.constexpr):
    tile_row, tile_col = tl.program_id(0), tl.program_id(1)
    rows = tile_row * TILE + tl.arange(0, TILE)
    cols = tile_col * TILE + tl.arange(0, TILE)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(X + rows[:, None].to(tl.int64) * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    codes = saturate(x * tl.load(SCALE), FP8_MAX).to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None].to(tl.int64) * n_cols + cols[None, :], codes, mask=mask)
    # data_t [N, M]: element (r, c) of input at (c, r).
    tl.store(Y_T + cols[:, None].to(tl.int64) * n_rows + rows[None, :], tl.trans(codes), mask=tl.trans(mask))
    tl.store(AMAX_PARTIAL + tile_row.to(tl.int64) * tl.num_programs(1) + tile_col, tl.max(tl.max(magnitude(x), 1), 0))


@triton.jit
def _dequantize_kernel(X, SCALE_INV, Y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offsets, (x * tl.load(SCALE_INV)).to(Y.dtype.element_ty), mask=mask)


def fp8_quantize(input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    x = input.contiguous()
    data = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    programs = triton.cdiv(x.numel(), BLOCK)
    partials = torch.empty(programs, dtype=torch.float32, device=x.device)
    if programs:
        _quantize_kernel[(programs,)](x, scale.contiguous(), data, partials, x.numel(), FP8_MAX=fp8_max(fp8_dtype),
                                      BLOCK=BLOCK, num_warps=8)
    return data, amax_of_partials(partials)


def fp8_quantize_current(input: Tensor, fp8_dtype: torch.dtype, amax_epsilon: float,
                         power_2: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Current scaling's cast: the amax and scale as the reference takes them (one reduction
    and a few one-element ops on the device), the codes by fp8_quantize's kernel."""
    return reference_fp8_cast.fp8_quantize_current(input, fp8_dtype, amax_epsilon, power_2, cast=fp8_quantize)


def fp8_quantize_delayed_(input: Tensor, scales: Tensor, slot: int, amax_history: Tensor, amax_recorded: Tensor,
                          fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Delayed scaling's cast of one slot: the record as the reference makes it, the codes by
    fp8_quantize's kernel."""
    return reference_fp8_cast.fp8_quantize_delayed_(input, scales, slot, amax_history, amax_recorded, fp8_dtype,
                                                    cast=fp8_quantize)


def fp8_quantize_transpose(input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    x = input.contiguous()
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    data = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    data_t = torch.empty((n_cols, n_rows), dtype=fp8_dtype, device=x.device)
    grid = (triton.cdiv(n_rows, TILE), triton.cdiv(n_cols, TILE))
    partials = torch.empty(grid, dtype=torch.float32, device=x.device)
    if n_rows and n_cols:
        _quantize_transpose_kernel[grid](x, scale.contiguous(), data, data_t, partials, n_rows, n_cols,
                                         FP8_MAX=fp8_max(fp8_dtype), TILE=TILE, num_warps=8)
    return data, data_t, amax_of_partials(partials)


def fp8_dequantize(data: Tensor, scale_inv: Tensor, out_dtype: torch.dtype) -> Tensor:
    x = data.contiguous()
    output = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    programs = triton.cdiv(x.numel(), BLOCK)
    if programs:
        _dequantize_kernel[(programs,)](x, scale_inv.contiguous(), output, x.numel(), BLOCK=BLOCK, num_warps=8)
    return output
