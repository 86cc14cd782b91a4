"""TE's raw buffers of an NVFP4 tensor, in and out: the operand (fp8/nvfp4_operand.py) that
NVFP4Tensor(rowwise_data=..., ...) / NVFP4TensorStorage(**metadata) wraps, checked argument by
argument, and the metadata dict get_metadata() gives back. The scales come in TE's layout (the
E4M3 bytes padded to 128-row, 4-block tiles, without the GEMM swizzle) or unpadded."""
from typing import Optional

import torch
from torch import Tensor

from ..fp8.nvfp4_operand import Nvfp4Pair, Nvfp4Usage

BLOCK = 16


def _scales(scale_inv: Optional[Tensor], rows: int, cols: int, name: str) -> Tensor:
    """The [rows, ceil(cols / 16)] E4M3 scales out of scale_inv (uint8 or float8_e4m3fn, padded or not)."""
    blocks = -(-cols // BLOCK)
    if scale_inv is None:
        raise ValueError(f"NVFP4Tensor: {name} is needed with its codes")
    if scale_inv.dtype not in (torch.uint8, torch.float8_e4m3fn) or scale_inv.dim() != 2 or \
            scale_inv.shape[0] < rows or scale_inv.shape[1] < blocks:
        raise ValueError(f"NVFP4Tensor: {name} must be uint8 or float8_e4m3fn of at least [{rows}, {blocks}] "
                         f"(one E4M3 scale per 16 values), got {scale_inv.dtype} {tuple(scale_inv.shape)}")
    return scale_inv[:rows, :blocks].contiguous().view(torch.float8_e4m3fn)


def _usage(data: Tensor, scale_inv: Optional[Tensor], amax: Optional[Tensor], cols: int, usage: str,
           row_scaled: bool, e4m3_max: int) -> Nvfp4Usage:
    """One usage of a matrix [rows, cols] (the transpose's for the column-wise one) from TE's buffers."""
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != -(-cols // 2):
        raise ValueError(f"NVFP4Tensor: {usage}_data must be uint8 [rows, {-(-cols // 2)}] (two codes a byte for "
                         f"{cols} columns), got {data.dtype} {tuple(data.shape)}")
    rows = data.shape[0]
    amax_count = rows if row_scaled else 1
    if amax is None or amax.numel() != amax_count:
        got = "none" if amax is None else f"{amax.numel()} values"
        raise ValueError(f"NVFP4Tensor: amax_{usage} must hold {amax_count} fp32 value(s) "
                         f"({'one per row' if row_scaled else 'the global amax'}), got {got}")
    scales = _scales(scale_inv, rows, cols, f"{usage}_scale_inv")
    return Nvfp4Usage(data, scales, amax.reshape(amax_count).to(torch.float32), cols, e4m3_max=e4m3_max,
                      row_scaled=row_scaled)


def operand_from_buffers(shape: Optional[torch.Size], rowwise_data: Optional[Tensor],
                         rowwise_scale_inv: Optional[Tensor], amax_rowwise: Optional[Tensor],
                         columnwise_data: Optional[Tensor], columnwise_scale_inv: Optional[Tensor],
                         amax_columnwise: Optional[Tensor], row_scaled: bool, e4m3_max: int) -> Nvfp4Pair:
    """The operand of a matrix of `shape`'s [prod(shape[:-1]), shape[-1]] (without a shape: two
    columns a byte of the codes, so an odd width needs the shape), either usage None."""
    if rowwise_data is None and columnwise_data is None:
        raise ValueError("NVFP4Tensor: rowwise_data or columnwise_data is needed")
    if shape is not None:
        rows, cols = (shape[:-1].numel(), shape[-1]) if len(shape) else (1, 1)
    elif rowwise_data is not None:
        rows, cols = rowwise_data.shape[0], 2 * rowwise_data.shape[-1]
    else:
        cols, rows = columnwise_data.shape[0], 2 * columnwise_data.shape[-1]
    rowwise = columnwise = None
    if rowwise_data is not None:
        rowwise = _usage(rowwise_data, rowwise_scale_inv, amax_rowwise, cols, "rowwise", row_scaled, e4m3_max)
        if rowwise.data.shape[0] != rows:
            raise ValueError(f"NVFP4Tensor: rowwise_data has {rowwise.data.shape[0]} rows, the shape {rows}")
    if columnwise_data is not None:
        columnwise = _usage(columnwise_data, columnwise_scale_inv, amax_columnwise, rows, "columnwise", row_scaled,
                            e4m3_max)
        if columnwise.data.shape[0] != cols:
            raise ValueError(f"NVFP4Tensor: columnwise_data (the transpose's codes) has {columnwise.data.shape[0]} "
                             f"rows, the matrix {cols} columns")
    return Nvfp4Pair(rowwise, columnwise)
