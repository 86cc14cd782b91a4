"""Per-tensor FP8 casts as dispatcher ops: fake kernels and the reference on devices without
a kernel. Not differentiable themselves: FP8 modules wrap them in their own autograd rules.

    fp8_quantize(input, scale, fp8_dtype) -> (data, amax)
        data = saturate(input * scale) in fp8_dtype; amax = max |input| (unscaled).
    fp8_quantize_transpose(input, scale, fp8_dtype) -> (data, data_t, amax)
        the same, plus data_t [N, M]: the codes of input viewed as [M, N], transposed.
    fp8_quantize_current(input, fp8_dtype, amax_epsilon, power_2) -> (data, scale, scale_inv, amax)
        current scaling's cast: the scale from the input's own amax, then the codes.
    fp8_quantize_delayed_(input, scales, slot, amax_history, amax_recorded, fp8_dtype) -> (data, scale_inv)
        delayed scaling's cast of one slot of an FP8 state, its amax recorded there in place.
    fp8_dequantize(data, scale_inv, out_dtype) -> data * scale_inv in out_dtype
    fp8_transpose(data [M, N]) -> data_t [N, M]: the codes transposed, contiguous
"""
from typing import Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _fp8_checks
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@torch.library.register_fake(f"{NAMESPACE}::fp8_quantize")
def _fp8_quantize_fake(input, scale, fp8_dtype):
    _fp8_checks.fp8_quantize(input, scale, fp8_dtype)
    return input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty((), dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::fp8_quantize_transpose")
def _fp8_quantize_transpose_fake(input, scale, fp8_dtype):
    _fp8_checks.fp8_quantize_transpose(input, scale, fp8_dtype)
    cols = input.shape[-1]
    rows = input.numel() // cols if cols else 0
    return (input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty((cols, rows), dtype=fp8_dtype),
            input.new_empty((), dtype=torch.float32))


@torch.library.register_fake(f"{NAMESPACE}::fp8_quantize_current")
def _fp8_quantize_current_fake(input, fp8_dtype, amax_epsilon, power_2):
    _fp8_checks.fp8_quantize_current(input, fp8_dtype, amax_epsilon, power_2)
    one = (1,)
    return (input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty(one, dtype=torch.float32),
            input.new_empty(one, dtype=torch.float32), input.new_empty(one, dtype=torch.float32))


@torch.library.register_fake(f"{NAMESPACE}::fp8_quantize_delayed_")
def _fp8_quantize_delayed_fake(input, scales, slot, amax_history, amax_recorded, fp8_dtype):
    _fp8_checks.fp8_quantize_delayed_(input, scales, slot, amax_history, amax_recorded, fp8_dtype)
    return input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty((1,), dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::fp8_dequantize")
def _fp8_dequantize_fake(data, scale_inv, out_dtype):
    _fp8_checks.fp8_dequantize(data, scale_inv, out_dtype)
    return data.new_empty(data.shape, dtype=out_dtype)


@torch.library.register_fake(f"{NAMESPACE}::fp8_transpose")
def _fp8_transpose_fake(data):
    _fp8_checks.fp8_transpose(data)
    return data.new_empty((data.shape[1], data.shape[0]))


for _name in ("fp8_quantize", "fp8_quantize_transpose", "fp8_quantize_current", "fp8_quantize_delayed_",
              "fp8_dequantize"):
    serve_on_accelerators(_name, getattr(reference, _name), triton_module="fp8_cast",
                          check=getattr(_fp8_checks, _name))
serve_on_accelerators("fp8_transpose", reference.fp8_transpose, triton_module="fp8_transpose",
                      check=_fp8_checks.fp8_transpose)


def fp8_quantize(input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(saturate(input * scale) as fp8_dtype, max |input|) in one pass over input."""
    return _ops.fp8_quantize(input, scale, fp8_dtype)


def fp8_quantize_transpose(input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """fp8_quantize plus the transposed codes [N, M] of input viewed as [M, N], in one pass."""
    return _ops.fp8_quantize_transpose(input, scale, fp8_dtype)


def fp8_quantize_current(input: Tensor, fp8_dtype: torch.dtype, amax_epsilon: float = 0.0,
                         power_2: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Current scaling's cast in one call: (codes, scale, scale_inv, amax), the scale from
    the input's own amax (scaling.current_scale's rule), each of the three float32 [1]."""
    return _ops.fp8_quantize_current(input, fp8_dtype, float(amax_epsilon), bool(power_2))


def fp8_quantize_delayed_(input: Tensor, scales: Tensor, slot: int, amax_history: Tensor, amax_recorded: Tensor,
                          fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Delayed scaling's cast of one slot in one call: (codes at scales[slot], 1 / scales[slot]),
    the input's amax max-accumulated into amax_history[0, slot] and amax_recorded[slot] set."""
    return _ops.fp8_quantize_delayed_(input, scales, slot, amax_history, amax_recorded, fp8_dtype)


def fp8_dequantize(data: Tensor, scale_inv: Tensor, out_dtype: torch.dtype) -> Tensor:
    """data * scale_inv in out_dtype."""
    return _ops.fp8_dequantize(data, scale_inv, out_dtype)


def fp8_transpose(data: Tensor) -> Tensor:
    """The transpose [N, M] of FP8 codes [M, N], contiguous (on the CPU through registers,
    16 x 16 bytes at a time: 5.8 MB in about 0.5 ms on 2 Xeon cores, where torch's copy of the
    transposed view takes 3.6 ms)."""
    return _ops.fp8_transpose(data)
