"""NVFP4 casts as dispatcher ops: fake kernels, argument checks, and on devices without a compiled
kernel the Triton kernels, else the reference (semantics in reference/nvfp4.py). Not
differentiable themselves.

    nvfp4_amax(input [rows, cols], transpose, rht, per_row=False) -> amax fp32 [1], or [rows] per row
    nvfp4_quantize(input, amax, block_rows, transpose, rht, sr_rng, e4m3_max=448, four_over_six="off",
                   scaled_error=False)
        -> (data uint8 [rows, ceil(cols / 2)], scales float8_e4m3fn [rows, ceil(cols / 16)])
        of input, or of input^T when transpose (rows and cols are then input's cols and rows);
        amax [1], or [rows] with block_rows 1 (row-scaled)
    nvfp4_dequantize(data, scales, amax, cols, out_dtype, e4m3_max=448) -> [rows, cols]; amax [1] or [rows]
    nvfp4_transpose_tiles(data, scales, cols) -> (data [cols, ceil(rows / 2)], scales [cols, ceil(rows / 16)]):
        the column-wise usage of a 16 x 16-tile cast (nearest, no transform, no 4over6) from its row-wise one

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
    """float32 on ref's device; its size is each op's to check."""
    _checks.same_device(op, "amax", amax, ref_arg, ref)
    _checks.dtype(op, "amax", amax, torch.float32)


def _e4m3_max(op: str, e4m3_max: int) -> None:
    if e4m3_max not in (448, 256):
        fail(op, f"e4m3_max must be 448 or 256, got {e4m3_max}")


def check_amax(input, transpose, rht, per_row=False) -> Tuple[int, int]:
    """The checks; returns (rows, cols) of what is cast."""
    return _source_shape("nvfp4_amax", input, transpose, rht)


def check_quantize(input, amax, block_rows, transpose, rht, sr_rng, e4m3_max=448, four_over_six="off",
                   scaled_error=False) -> Tuple[int, int]:
    """The checks; returns (rows, cols) of what is cast."""
    op = "nvfp4_quantize"
    shape = _source_shape(op, input, transpose, rht)
    if block_rows not in (1, BLOCK):
        fail(op, f"block_rows must be 1 or 16, got {block_rows}")
    _amax(op, amax, "input", input)
    if not (amax.numel() == 1 or (block_rows == 1 and amax.numel() == shape[0])):
        fail(op, f"amax must hold one element (the tensor's amax) or, with block_rows 1, one per row of what is cast "
                 f"({shape[0]}), got shape {shape_text(amax.shape)} with block_rows {block_rows}")
    _e4m3_max(op, e4m3_max)
    if four_over_six not in reference.FOUR_OVER_SIX:
        fail(op, f"four_over_six must be 'off', 'mae' or 'mse', got '{four_over_six}'")
    if four_over_six != "off" and sr_rng is not None:
        fail(op, f"four_over_six '{four_over_six}' keeps each block's nearer cast; it takes no sr_rng "
                 "(stochastic rounding)")
    if sr_rng is not None:
        _checks.same_device(op, "sr_rng", sr_rng, "input", input)
        _checks.dtype(op, "sr_rng", sr_rng, torch.int64)
        _checks.shape(op, "sr_rng", sr_rng, (2,), "(seed, offset)")
        # Philox's counter holds a row's index in 32 bits and a column's in 32 bits over 4.
        if shape[0] > 1 << 32 or shape[1] > 1 << 34:
            fail(op, f"stochastic rounding takes at most 2^32 rows and 2^34 columns, got {shape[0]} x {shape[1]}")
    return shape


def _codes(op: str, data: Tensor, scales: Tensor, cols: int) -> int:
    """Checks packed codes data [rows, ceil(cols / 2)] and their scales [rows, ceil(cols / 16)]; rows."""
    _checks.dtype(op, "data", data, torch.uint8)
    if data.dim() != 2:
        fail(op, f"data must be 2-D [rows, ceil(cols / 2)], got shape {shape_text(data.shape)}")
    if not (cols >= 0 and _ceil_div(cols, 2) == data.shape[1]):
        fail(op, f"cols {cols} does not fit data of shape {shape_text(data.shape)} (two codes per byte)")
    _checks.same_device(op, "scales", scales, "data", data)
    _checks.dtype(op, "scales", scales, torch.float8_e4m3fn)
    _checks.shape(op, "scales", scales, (data.shape[0], _ceil_div(cols, BLOCK)), "one scale per 16 values of a row")
    return data.shape[0]


def check_dequantize(data, scales, amax, cols, out_dtype, e4m3_max=448):
    op = "nvfp4_dequantize"
    _checks.high_precision_dtype(op, "out_dtype", out_dtype)
    _codes(op, data, scales, cols)
    _amax(op, amax, "data", data)
    if amax.numel() not in (1, data.shape[0]):
        fail(op, f"amax must hold one element (the tensor's amax) or one per row of data ({data.shape[0]}), "
                 f"got shape {shape_text(amax.shape)}")
    _e4m3_max(op, e4m3_max)


def check_transpose_tiles(data, scales, cols) -> int:
    return _codes("nvfp4_transpose_tiles", data, scales, cols)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_amax")
def _nvfp4_amax_fake(input, transpose, rht, per_row=False):
    rows, _ = check_amax(input, transpose, rht, per_row)
    return input.new_empty((rows if per_row else 1,), dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_quantize")
def _nvfp4_quantize_fake(input, amax, block_rows, transpose, rht, sr_rng, e4m3_max=448, four_over_six="off",
                         scaled_error=False):
    rows, cols = check_quantize(input, amax, block_rows, transpose, rht, sr_rng, e4m3_max, four_over_six,
                                scaled_error)
    return (input.new_empty((rows, _ceil_div(cols, 2)), dtype=torch.uint8),
            input.new_empty((rows, _ceil_div(cols, BLOCK)), dtype=torch.float8_e4m3fn))


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_dequantize")
def _nvfp4_dequantize_fake(data, scales, amax, cols, out_dtype, e4m3_max=448):
    check_dequantize(data, scales, amax, cols, out_dtype, e4m3_max)
    return data.new_empty((data.shape[0], cols), dtype=out_dtype)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_transpose_tiles")
def _nvfp4_transpose_tiles_fake(data, scales, cols):
    rows = check_transpose_tiles(data, scales, cols)
    return (data.new_empty((cols, _ceil_div(rows, 2))), scales.new_empty((cols, _ceil_div(rows, BLOCK))))


# Accelerators run the Triton kernels (triton/nvfp4.py) where they serve the call, else the reference,
# after the binding's checks.
serve_on_accelerators("nvfp4_amax", reference.nvfp4_amax, triton_module="nvfp4", check=check_amax)
serve_on_accelerators("nvfp4_quantize", reference.nvfp4_quantize, triton_module="nvfp4", check=check_quantize)
serve_on_accelerators("nvfp4_dequantize", reference.nvfp4_dequantize, triton_module="nvfp4", check=check_dequantize)
serve_on_accelerators("nvfp4_transpose_tiles", reference.nvfp4_transpose_tiles, check=check_transpose_tiles)


def nvfp4_amax(input: Tensor, transpose: bool = False, rht: bool = False, per_row: bool = False) -> Tensor:
    """fp32 [1]: max |x| (NaN skipped) of what nvfp4_quantize casts with the same options;
    per_row: fp32 [rows], each row's (row-scaled NVFP4)."""
    return _ops.nvfp4_amax(input, transpose, rht, per_row)


def nvfp4_quantize(input: Tensor, amax: Tensor, block_rows: int = 1, transpose: bool = False, rht: bool = False,
                   sr_rng: Optional[Tensor] = None, e4m3_max: int = 448, four_over_six: str = "off",
                   scaled_error: bool = False) -> Tuple[Tensor, Tensor]:
    """(packed E2M1 codes, E4M3 scales) of input (or input^T) in 1 x 16 blocks, or 16 x 16 with
    block_rows=16, with the tensor's amax [1] or, 1 x 16, each row's [rows]; stochastic rounding
    with sr_rng (seed, offset); e4m3_max: the global scale's bound (448, or 256); four_over_six
    "mae" or "mse": each block keeps the nearer of its two casts (its largest value on 4, and on
    6), the error measured in the scaled domain with scaled_error."""
    return _ops.nvfp4_quantize(input, amax, block_rows, transpose, rht, sr_rng, e4m3_max, four_over_six, scaled_error)


def nvfp4_dequantize(data: Tensor, scales: Tensor, amax: Tensor, cols: int, out_dtype: torch.dtype,
                     e4m3_max: int = 448) -> Tensor:
    """The values [rows, cols] in out_dtype of packed codes, their scales and the tensor's amax
    [1] or each row's [rows], cast with the global scale's bound e4m3_max."""
    return _ops.nvfp4_dequantize(data, scales, amax, cols, out_dtype, e4m3_max)


def nvfp4_transpose_tiles(data: Tensor, scales: Tensor, cols: int) -> Tuple[Tensor, Tensor]:
    """The column-wise usage (data [cols, ceil(rows / 2)], scales [cols, ceil(rows / 16)]) of a
    16 x 16-tile cast of nearest rounding without the transform or 4over6, from its row-wise
    data [rows, ceil(cols / 2)] and scales: the bits nvfp4_quantize(..., transpose=True) gives."""
    return _ops.nvfp4_transpose_tiles(data, scales, cols)
