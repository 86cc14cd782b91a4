"""Argument checks of the per-tensor and block-scaled FP8 cast ops (bindings/fp8_ops.cpp's and
bindings/fp8_block_ops.cpp's, in Python): run by their fake kernels and before the Triton
kernels or the reference on accelerators: one function per op, taking the op's arguments."""
import torch
from torch import Tensor

from ..reference.fp8_block import block_grid
from . import _checks
from ._checks import aten_name, fail, shape_text

MAX_BLOCK_COLS = 1024  # te_kernels::kMaxBlockCols
SCALE_MODES = ("fp32", "pow2", "e8m0")


def _quantize(op: str, input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> None:
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.high_precision_dtype(op, "input", input.dtype)
    _checks.per_tensor_scale(op, "scale", scale, "the data", input)


def fp8_quantize(input, scale, fp8_dtype):
    _quantize("fp8_quantize", input, scale, fp8_dtype)


def fp8_quantize_transpose(input, scale, fp8_dtype):
    _quantize("fp8_quantize_transpose", input, scale, fp8_dtype)
    if input.dim() < 1:
        fail("fp8_quantize_transpose", "input must have at least one dimension, got a 0-d tensor")


def fp8_quantize_current(input, fp8_dtype, amax_epsilon, power_2):
    _checks.fp8_format("fp8_quantize_current", "fp8_dtype", fp8_dtype)
    _checks.high_precision_dtype("fp8_quantize_current", "input", input.dtype)
    if amax_epsilon < 0:
        fail("fp8_quantize_current", f"amax_epsilon must be >= 0, got {amax_epsilon}")


def fp8_quantize_delayed_(input, scales, slot, amax_history, amax_recorded, fp8_dtype):
    op = "fp8_quantize_delayed_"
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.high_precision_dtype(op, "input", input.dtype)
    _checks.dtype(op, "scales", scales, torch.float32)
    _checks.dtype(op, "amax_history", amax_history, torch.float32)
    _checks.dtype(op, "amax_recorded", amax_recorded, torch.bool)
    slots = scales.shape[0] if scales.dim() == 1 else -1
    if slots < 0:
        fail(op, f"scales must be a contiguous 1-D tensor, got shape {shape_text(scales.shape)}")
    if not 0 <= slot < slots:
        fail(op, f"slot {slot} is outside the {slots} slots of scales")
    if amax_history.dim() != 2 or amax_history.shape[0] < 1 or amax_history.shape[1] != slots:
        fail(op, f"amax_history must be a contiguous [history_len >= 1, {slots}] tensor, got shape "
                 f"{shape_text(amax_history.shape)}")
    if tuple(amax_recorded.shape) != (slots,):
        fail(op, f"amax_recorded must be a contiguous [{slots}] tensor, got shape {shape_text(amax_recorded.shape)}")
    for name, t in (("scales", scales), ("amax_history", amax_history), ("amax_recorded", amax_recorded)):
        _checks.same_device(op, name, t, "the input", input)


def fp8_dequantize(data, scale_inv, out_dtype):
    _checks.fp8_format("fp8_dequantize", "data", data.dtype)
    _checks.high_precision_dtype("fp8_dequantize", "out_dtype", out_dtype)
    _checks.per_tensor_scale("fp8_dequantize", "scale_inv", scale_inv, "the data", data)


def fp8_transpose(data):
    _checks.fp8_format("fp8_transpose", "data", data.dtype)
    if data.dim() != 2:
        raise ValueError(f"fp8_transpose: data must be 2-D [rows, cols], got shape {list(data.shape)}")


def _matrix_and_blocks(op: str, arg: str, t: Tensor, block_rows: int, block_cols: int) -> None:
    if t.dim() != 2:
        fail(op, f"{arg} must be 2-D [rows, cols], got shape {shape_text(t.shape)}")
    if not (block_rows >= 1 and 1 <= block_cols <= MAX_BLOCK_COLS):
        fail(op, f"blocks of {block_rows} x {block_cols} are not supported (rows >= 1, 1 <= cols <= "
                 f"{MAX_BLOCK_COLS})")


def fp8_block_quantize(input, block_rows, block_cols, fp8_dtype, scale_mode, amax_epsilon):
    op = "fp8_block_quantize"
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.high_precision_dtype(op, "input", input.dtype)
    if scale_mode not in SCALE_MODES:
        fail(op, f"scale_mode must be 'fp32', 'pow2' or 'e8m0', got '{scale_mode}'")
    _matrix_and_blocks(op, "input", input, block_rows, block_cols)
    if not amax_epsilon >= 0:
        fail(op, f"amax_epsilon must be >= 0, got {amax_epsilon}")


def fp8_block_dequantize(data, scale_inv, block_rows, block_cols, out_dtype):
    op = "fp8_block_dequantize"
    _checks.fp8_format(op, "data", data.dtype)
    _checks.high_precision_dtype(op, "out_dtype", out_dtype)
    _matrix_and_blocks(op, "data", data, block_rows, block_cols)
    _checks.same_device(op, "scale_inv", scale_inv, "data", data)
    if scale_inv.dtype not in (torch.uint8, torch.float32):
        fail(op, "scale_inv must be float32 (fp32 / power-of-two scales) or uint8 (E8M0 exponents), got "
                 f"{aten_name(scale_inv.dtype)}")
    _checks.shape(op, "scale_inv", scale_inv, block_grid(*data.shape, block_rows, block_cols),
                  f"one scale per block of {block_rows} x {block_cols}")
