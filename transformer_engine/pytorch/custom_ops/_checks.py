"""Argument checks for the ops on devices without a compiled kernel (the Triton kernels and the
reference) and in their fake kernels (torch.compile, meta tensors): the same checks, and the
same ValueError messages, as the compiled CPU ops' (bindings/tensor_checks.cpp). Each message
names the op, the argument and the sizes or dtypes involved."""
from typing import Sequence

import torch
from torch import Tensor

# The names ATen prints for dtypes, as the compiled ops' messages carry them.
_ATEN_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.bfloat16: "BFloat16", torch.float16: "Half",
               torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
               torch.uint8: "Byte", torch.bool: "Bool", torch.float8_e4m3fn: "Float8_e4m3fn",
               torch.float8_e5m2: "Float8_e5m2"}
KERNEL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
HIGH_PRECISION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def aten_name(dtype: torch.dtype) -> str:
    return _ATEN_NAMES.get(dtype, str(dtype))


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(size)) for size in shape) + "]"


def fail(op: str, message: str) -> None:
    raise ValueError(f"{op}: {message}")


def kernel_dtype(op: str, arg: str, t: Tensor) -> None:
    if t.dtype not in KERNEL_DTYPES:
        fail(op, f"{arg} must be float32, float64, bfloat16 or float16, got {aten_name(t.dtype)} "
                 f"(shape {shape_text(t.shape)})")


def high_precision_dtype(op: str, arg: str, dtype: torch.dtype) -> None:
    if dtype not in HIGH_PRECISION_DTYPES:
        fail(op, f"{arg} must be float32, bfloat16 or float16, got {aten_name(dtype)}")


def fp8_format(op: str, arg: str, dtype: torch.dtype) -> None:
    if dtype not in FP8_DTYPES:
        fail(op, f"{arg} must be torch.float8_e4m3fn or torch.float8_e5m2, got {aten_name(dtype)}")


def same_device(op: str, arg: str, t: Tensor, ref_arg: str, ref: Tensor) -> None:
    if t.device != ref.device:
        fail(op, f"{arg} is on {t.device} but {ref_arg} is on {ref.device}; move them to the same device")


def shape(op: str, arg: str, t: Tensor, expected: Sequence[int], why: str) -> None:
    if tuple(t.shape) != tuple(expected):
        fail(op, f"{arg} has shape {shape_text(t.shape)} but {shape_text(expected)} was expected ({why})")


def dtype(op: str, arg: str, t: Tensor, expected: torch.dtype) -> None:
    if t.dtype != expected:
        fail(op, f"{arg} has dtype {aten_name(t.dtype)} but {aten_name(expected)} was expected")


def per_tensor_scale(op: str, arg: str, scale: Tensor, ref_arg: str, ref: Tensor) -> None:
    """A per-tensor FP8 scale (or scale_inv): one float32 element on ref's device."""
    same_device(op, arg, scale, ref_arg, ref)
    dtype(op, arg, scale, torch.float32)
    if scale.numel() != 1:
        fail(op, f"{arg} must hold one element (per-tensor scaling), got shape {shape_text(scale.shape)}")


def holds_values(t: Tensor) -> bool:
    """Whether t's values can be read: not a meta tensor, not a fake one (torch.compile's tracing)."""
    return t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)
