"""Block-scaled FP8 casts as dispatcher ops: fake kernels and the reference on devices
without a kernel (semantics in reference/fp8_block.py). Not differentiable themselves.

    fp8_block_quantize(input [rows, cols], block_rows, block_cols, fp8_dtype, scale_mode,
                       amax_epsilon) -> (data [rows, cols], scale_inv [grid_rows, grid_cols])
    fp8_block_dequantize(data, scale_inv, block_rows, block_cols, out_dtype) -> [rows, cols]
"""
from typing import Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ..reference.fp8_block import block_grid
from . import _fp8_checks
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)


@torch.library.register_fake(f"{NAMESPACE}::fp8_block_quantize")
def _fp8_block_quantize_fake(input, block_rows, block_cols, fp8_dtype, scale_mode, amax_epsilon):
    _fp8_checks.fp8_block_quantize(input, block_rows, block_cols, fp8_dtype, scale_mode, amax_epsilon)
    grid = block_grid(*input.shape, block_rows, block_cols)
    scale_dtype = torch.uint8 if scale_mode == "e8m0" else torch.float32
    return input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty(grid, dtype=scale_dtype)


@torch.library.register_fake(f"{NAMESPACE}::fp8_block_dequantize")
def _fp8_block_dequantize_fake(data, scale_inv, block_rows, block_cols, out_dtype):
    _fp8_checks.fp8_block_dequantize(data, scale_inv, block_rows, block_cols, out_dtype)
    return data.new_empty(data.shape, dtype=out_dtype)


for _name in ("fp8_block_quantize", "fp8_block_dequantize"):
    serve_on_accelerators(_name, getattr(reference, _name), triton_module="fp8_block",
                          check=getattr(_fp8_checks, _name))


def fp8_block_quantize(input: Tensor, block: Tuple[int, int], fp8_dtype: torch.dtype, scale_mode: str,
                       amax_epsilon: float = 0.0) -> Tuple[Tensor, Tensor]:
    """(codes, scale_inv) of the 2-D input with one scale per block = (rows, cols)."""
    return _ops.fp8_block_quantize(input, block[0], block[1], fp8_dtype, scale_mode, amax_epsilon)


def fp8_block_dequantize(data: Tensor, scale_inv: Tensor, block: Tuple[int, int], out_dtype: torch.dtype) -> Tensor:
    """data * scale_inv of each element's block, in out_dtype."""
    return _ops.fp8_block_dequantize(data, scale_inv, block[0], block[1], out_dtype)
