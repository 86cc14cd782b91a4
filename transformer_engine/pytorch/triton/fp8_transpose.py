"""FP8 codes transposed in Triton, with the op's signature (reference/fp8_cast.py):
fp8_transpose(data [M, N], any strides) -> data_t [N, M], contiguous, bit for bit.

A transpose moves codes and never converts them, so the kernel moves them as bytes (uint8
views of both tensors): no FP8 load or conversion, hence no E4M3 support needed (it runs on
sm_80 and on MUSA parts before MP31 too) and nothing for the interpreter's FP8 casts to touch.
A program copies one [TILE, TILE] tile, read through the input's strides (a view is not copied
first); Triton stages tl.trans through shared memory, so the loads along input rows and the
stores along output rows are both coalesced. The grid is one-dimensional, tiles in row-major
order, so neither side is bounded by CUDA's 65535 on the second grid dimension; offsets are
64-bit.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

TILE = 64  # bytes per side of a program's tile


def supports(op_name: str, args: tuple) -> bool:
    """Every call the checks (custom_ops/_fp8_checks.py) let through: both formats on every
    device (bytes are moved, not converted), any strides and sizes."""
    return True


@triton.jit
def _transpose_kernel(X, Y_T, n_rows, n_cols, stride_row, stride_col, TILE: tl.constexpr):
    tiles_across = tl.cdiv(n_cols, TILE)
    tile = tl.program_id(0)
    rows = (tile // tiles_across) * TILE + tl.arange(0, TILE)
    cols = (tile % tiles_across) * TILE + tl.arange(0, TILE)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    codes = tl.load(X + rows[:, None].to(tl.int64) * stride_row + cols[None, :].to(tl.int64) * stride_col, mask=mask)
    # data_t [N, M]: element (r, c) of data at (c, r).
    tl.store(Y_T + cols[:, None].to(tl.int64) * n_rows + rows[None, :], tl.trans(codes), mask=tl.trans(mask))


def fp8_transpose(data: Tensor) -> Tensor:
    n_rows, n_cols = data.shape
    data_t = torch.empty((n_cols, n_rows), dtype=data.dtype, device=data.device)
    if data.numel():
        tiles = triton.cdiv(n_rows, TILE) * triton.cdiv(n_cols, TILE)
        _transpose_kernel[(tiles,)](data.view(torch.uint8), data_t.view(torch.uint8), n_rows, n_cols, *data.stride(),
                                    TILE=TILE, num_warps=4)
    return data_t
