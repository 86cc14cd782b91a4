"""NVFP4 casts as dispatcher ops: fake kernels, argument checks, and the reference on devices
without a kernel (semantics in reference/nvfp4.py). Not differentiable themselves.

    nvfp4_amax(input [rows, cols], transpose, rht) -> amax fp32 [1]
    nvfp4_quantize(input, amax, block_rows, transpose, rht, sr_rng)
        -> (data uint8 [rows, ceil(cols / 2)], scales float8_e4m3fn [rows, ceil(cols / 16)])
        of input, or of input^T when transpose (rows and cols are then input's cols and rows)
    nvfp4_dequantize(data, scales, amax, cols, out_dtype) -> [rows, cols]

The checks here are bindings/nvfp4_ops.cpp's, with its messages: the fake kernels and the
accelerators' reference run them.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._extension import NAMESPACE
from ..reference import nvfp4 as reference
from . import _checks
from ._checks import fail, shape_text
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
BLOCK = reference.BLOCK


def _ceil_div(a, b):
    return (a + b - 1) // b


def _source_shape(op: str, input: Tensor, transpose: bool, rht: bool) -> Tuple[int, int]:
    """(rows, cols) of what is cast: input, or input^T."""
    _checks.high_precision_dtype(op, "input", input.dtype)
    if input.dim() != 2:
        fail(op, f"input must be 2-D [rows, cols], got shape {shape_text(input.shape)}")
    rows, cols = (input.shape[1], input.shape[0]) if transpose else input.shape
    if rht and cols % BLOCK:
        fail(op, f"rht transforms blocks of 16 values along the rows of input{'^T' if transpose else ''}, whose "
                 f"{cols} columns are not a multiple of 16 (input shape {shape_text(input.shape)})")
    return rows, cols


def _amax(op: str, amax: Tensor, ref_arg: str, ref: Tensor) -> None:
    _checks.same_device(op, "amax", amax, ref_arg, ref)
    _checks.dtype(op, "amax", amax, torch.float32)
    if amax.numel() != 1:
        fail(op, f"amax must hold one element (the tensor's amax), got shape {shape_text(amax.shape)}")


def check_amax(input, transpose, rht):
    _source_shape("nvfp4_amax", input, transpose, rht)


def check_quantize(input, amax, block_rows, transpose, rht, sr_rng) -> Tuple[int, int]:
    """The checks; returns (rows, cols) of what is cast."""
    op = "nvfp4_quantize"
    shape = _source_shape(op, input, transpose, rht)
    if block_rows not in (1, BLOCK):
        fail(op, f"block_rows must be 1 or 16, got {block_rows}")
    _amax(op, amax, "input", input)
    if sr_rng is not None:
        _checks.same_device(op, "sr_rng", sr_rng, "input", input)
        _checks.dtype(op, "sr_rng", sr_rng, torch.int64)
        _checks.shape(op, "sr_rng", sr_rng, (2,), "(seed, offset)")
        # Philox's counter holds a row's index in 32 bits and a column's in 32 bits over 4.
        if shape[0] > 1 << 32 or shape[1] > 1 << 34:
            fail(op, f"stochastic rounding takes at most 2^32 rows and 2^34 columns, got {shape[0]} x {shape[1]}")
    return shape


def check_dequantize(data, scales, amax, cols, out_dtype):
    op = "nvfp4_dequantize"
    _checks.high_precision_dtype(op, "out_dtype", out_dtype)
    _checks.dtype(op, "data", data, torch.uint8)
    if data.dim() != 2:
        fail(op, f"data must be 2-D [rows, ceil(cols / 2)], got shape {shape_text(data.shape)}")
    if not (cols >= 0 and _ceil_div(cols, 2) == data.shape[1]):
        fail(op, f"cols {cols} does not fit data of shape {shape_text(data.shape)} (two codes per byte)")
    _checks.same_device(op, "scales", scales, "data", data)
    _checks.dtype(op, "scales", scales, torch.float8_e4m3fn)
    _checks.shape(op, "scales", scales, (data.shape[0], _ceil_div(cols, BLOCK)), "one scale per 16 values of a row")
    _amax(op, amax, "data", data)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_amax")
def _nvfp4_amax_fake(input, transpose, rht):
    check_amax(input, transpose, rht)
    return input.new_empty((1,), dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_quantize")
def _nvfp4_quantize_fake(input, amax, block_rows, transpose, rht, sr_rng):
    rows, cols = check_quantize(input, amax, block_rows, transpose, rht, sr_rng)
    return (input.new_empty((rows, _ceil_div(cols, 2)), dtype=torch.uint8),
            input.new_empty((rows, _ceil_div(cols, BLOCK)), dtype=torch.float8_e4m3fn))


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_dequantize")
def _nvfp4_dequantize_fake(data, scales, amax, cols, out_dtype):
    check_dequantize(data, scales, amax, cols, out_dtype)
    return data.new_empty((data.shape[0], cols), dtype=out_dtype)


# No Triton kernels yet: accelerators run the reference, after the binding's checks.
serve_on_accelerators("nvfp4_amax", reference.nvfp4_amax, check=check_amax)
serve_on_accelerators("nvfp4_quantize", reference.nvfp4_quantize, check=check_quantize)
serve_on_accelerators("nvfp4_dequantize", reference.nvfp4_dequantize, check=check_dequantize)


def nvfp4_amax(input: Tensor, transpose: bool = False, rht: bool = False) -> Tensor:
    """fp32 [1]: max |x| (NaN skipped) of what nvfp4_quantize casts with the same options."""
    return _ops.nvfp4_amax(input, transpose, rht)


def nvfp4_quantize(input: Tensor, amax: Tensor, block_rows: int = 1, transpose: bool = False, rht: bool = False,
                   sr_rng: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """(packed E2M1 codes, E4M3 scales) of input (or input^T) with the tensor's amax; 1 x 16
    blocks, or 16 x 16 with block_rows=16; stochastic rounding with sr_rng (seed, offset)."""
    return _ops.nvfp4_quantize(input, amax, block_rows, transpose, rht, sr_rng)


def nvfp4_dequantize(data: Tensor, scales: Tensor, amax: Tensor, cols: int, out_dtype: torch.dtype) -> Tensor:
    """The values [rows, cols] in out_dtype of packed codes, their scales and the tensor's amax."""
    return _ops.nvfp4_dequantize(data, scales, amax, cols, out_dtype)
