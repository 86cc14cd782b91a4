"""Activations as dispatcher ops, with a fused bias and its gradient, and a fused FP8 cast.

The ops (schemas in bindings/activation_ops.cpp; semantics in reference/activation.py):
    activation_fwd(input, bias?, activation, limit, alpha) -> output
    activation_bwd(grad_output, input, bias?, activation, limit, alpha) -> grad_input
    activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha) -> (grad_input, grad_bias)
    activation_fp8(input, bias?, activation, limit, alpha, scale, fp8_dtype) -> (data, amax)
    activation_bwd_fp8(grad_output, input, activation, limit, alpha, scale, fp8_dtype, with_transpose)
        -> (data, data_t, amax)
input [..., H]; bias, grad_bias [H]; output and grad_output [..., H], or [..., H/2] for the
gated (*glu) activations. limit and alpha are clamped_swiglu's (the others ignore them).
The backward ops recompute the activation from input: the forward saves no output.

The argument checks below are bindings/activation_ops.cpp's, in Python, in the same order and
with the same messages: run by the fake kernels and before the Triton kernels or the reference
on accelerators. Each takes the op's arguments and returns the shape of the activation's output.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE, kernels
from ..reference.activation import GATED, PLAIN
from . import _checks
from ._checks import fail, shape_text
from ._registry import direct_call_applies, no_double_backward, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
_LIMIT, _ALPHA = 7.0, 1.702  # clamped_swiglu's defaults


# --- argument checks (bindings/activation_ops.cpp's) ---------------------------------------
def _activation(op: str, activation: str, limit: float) -> None:
    if activation not in PLAIN + GATED:
        fail(op, f"unknown activation '{activation}'; expected one of {', '.join(PLAIN + GATED)}")
    if not limit >= 0:
        fail(op, f"limit must be non-negative, got {limit:g}")  # :g prints a double as C++ streams do


def _input(op: str, input: Tensor, bias: Optional[Tensor], activation: str) -> Tuple[int, ...]:
    """The output's shape: input's, with the last dimension halved for a gated activation."""
    _checks.high_precision_dtype(op, "input", input.dtype)
    if input.dim() < 1:
        fail(op, "input must have at least one dimension, got a 0-d tensor")
    out_shape = tuple(input.shape)
    if activation in GATED:
        if input.shape[-1] % 2:
            fail(op, "a gated activation splits the last dimension of input in two halves, so it must be even; "
                     f"input has shape {shape_text(input.shape)}")
        out_shape = (*out_shape[:-1], out_shape[-1] // 2)
    if bias is not None:
        _checks.same_device(op, "bias", bias, "input", input)
        _checks.dtype(op, "bias", bias, input.dtype)
        _checks.shape(op, "bias", bias, (input.shape[-1],), "one bias per element of input's last dimension")
    return out_shape


def _grad_output(op: str, grad_output: Tensor, input: Tensor, out_shape: Tuple[int, ...]) -> None:
    _checks.same_device(op, "grad_output", grad_output, "input", input)
    _checks.dtype(op, "grad_output", grad_output, input.dtype)
    _checks.shape(op, "grad_output", grad_output, out_shape, "the shape of the activation's output")


def _check_activation_fwd(input, bias, activation, limit, alpha):
    _activation("activation_fwd", activation, limit)
    return _input("activation_fwd", input, bias, activation)


def _check_activation_bwd(grad_output, input, bias, activation, limit, alpha):
    _activation("activation_bwd", activation, limit)
    out_shape = _input("activation_bwd", input, bias, activation)
    _grad_output("activation_bwd", grad_output, input, out_shape)
    return out_shape


def _check_activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha):
    _activation("activation_bwd_dbias", activation, limit)
    out_shape = _input("activation_bwd_dbias", input, bias, activation)
    _grad_output("activation_bwd_dbias", grad_output, input, out_shape)
    return out_shape


def _check_activation_fp8(input, bias, activation, limit, alpha, scale, fp8_dtype):
    op = "activation_fp8"
    _activation(op, activation, limit)
    out_shape = _input(op, input, bias, activation)
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.per_tensor_scale(op, "scale", scale, "input", input)
    return out_shape


def _check_activation_bwd_fp8(grad_output, input, activation, limit, alpha, scale, fp8_dtype, with_transpose):
    op = "activation_bwd_fp8"
    _activation(op, activation, limit)
    out_shape = _input(op, input, None, activation)
    _grad_output(op, grad_output, input, out_shape)
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.per_tensor_scale(op, "scale", scale, "input", input)
    return out_shape


@torch.library.register_fake(f"{NAMESPACE}::activation_fwd")
def _activation_fwd_fake(input, bias, activation, limit, alpha):
    return input.new_empty(_check_activation_fwd(input, bias, activation, limit, alpha))


@torch.library.register_fake(f"{NAMESPACE}::activation_bwd")
def _activation_bwd_fake(grad_output, input, bias, activation, limit, alpha):
    _check_activation_bwd(grad_output, input, bias, activation, limit, alpha)
    return input.new_empty(input.shape)


@torch.library.register_fake(f"{NAMESPACE}::activation_bwd_dbias")
def _activation_bwd_dbias_fake(grad_output, input, bias, activation, limit, alpha):
    _check_activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha)
    return input.new_empty(input.shape), bias.new_empty(bias.shape)


@torch.library.register_fake(f"{NAMESPACE}::activation_fp8")
def _activation_fp8_fake(input, bias, activation, limit, alpha, scale, fp8_dtype):
    out_shape = _check_activation_fp8(input, bias, activation, limit, alpha, scale, fp8_dtype)
    return input.new_empty(out_shape, dtype=fp8_dtype), input.new_empty((), dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::activation_bwd_fp8")
def _activation_bwd_fp8_fake(grad_output, input, activation, limit, alpha, scale, fp8_dtype, with_transpose):
    _check_activation_bwd_fp8(grad_output, input, activation, limit, alpha, scale, fp8_dtype, with_transpose)
    cols = input.shape[-1]
    rows = input.numel() // cols if cols else 0
    data_t = input.new_empty((cols, rows) if with_transpose else (0,), dtype=fp8_dtype)
    return input.new_empty(input.shape, dtype=fp8_dtype), data_t, input.new_empty((), dtype=torch.float32)


# activation_fwd's autograd kernel is C++ (bindings/activation_ops.cpp: a Python formula
# costs a small call more than its kernel); its backward ops get this refusal.
for _name in ("activation_bwd", "activation_bwd_dbias", "activation_bwd_fp8"):
    torch.library.register_autograd(f"{NAMESPACE}::{_name}", no_double_backward(_name))

serve_on_accelerators("activation_fwd", reference.activation_fwd, triton_module="activation",
                      check=_check_activation_fwd)
serve_on_accelerators("activation_bwd", reference.activation_bwd, triton_module="activation",
                      check=_check_activation_bwd)
serve_on_accelerators("activation_bwd_dbias", reference.activation_bwd_dbias, triton_module="activation",
                      check=_check_activation_bwd_dbias)
serve_on_accelerators("activation_fp8", reference.activation_fp8, triton_module="activation",
                      check=_check_activation_fp8)


def _composed_bwd_fp8(grad_output, input, activation, limit, alpha, scale, fp8_dtype, with_transpose):
    """activation_bwd_fp8 as the two ops it fuses, each on the device's own kernel (Triton where
    installed): activation_bwd, then the cast (with its transpose). No fused kernel of its own
    on accelerators yet; the same codes, the gradient written in between."""
    grad_input = _ops.activation_bwd(grad_output, input, None, activation, limit, alpha)
    if with_transpose:
        return _ops.fp8_quantize_transpose(grad_input, scale, fp8_dtype)
    data, amax = _ops.fp8_quantize(grad_input, scale, fp8_dtype)
    return data, data.new_empty(0), amax


serve_on_accelerators("activation_bwd_fp8", _composed_bwd_fp8, check=_check_activation_bwd_fp8)


def activation(input: Tensor, activation: str, bias: Optional[Tensor] = None, limit: float = _LIMIT,
               alpha: float = _ALPHA) -> Tensor:
    """act(input + bias) by name (see the module docstring); differentiable in input and bias."""
    if direct_call_applies((input, bias)):
        return kernels.direct.activation(input, bias, activation, limit, alpha)
    return _ops.activation_fwd(input, bias, activation, limit, alpha)


def activation_grad(grad_output: Tensor, input: Tensor, activation: str, bias: Optional[Tensor] = None,
                    limit: float = _LIMIT, alpha: float = _ALPHA) -> Tuple[Tensor, Optional[Tensor]]:
    """(grad_input, grad_bias) of activation(input, activation, bias) for grad_output, in one
    pass over input (grad_bias None without a bias); outside autograd."""
    grad_output = grad_output.contiguous()
    if bias is None:
        return _ops.activation_bwd(grad_output, input, None, activation, limit, alpha), None
    return _ops.activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha)


def activation_fp8(input: Tensor, activation: str, scale: Tensor, fp8_dtype: torch.dtype,
                   bias: Optional[Tensor] = None, limit: float = _LIMIT, alpha: float = _ALPHA) -> Tuple[Tensor, Tensor]:
    """(saturate(y * scale) as fp8_dtype, max |y|) for y = activation(input, activation, bias),
    in one pass and without writing y: bit for bit fp8_quantize(activation(...), scale, fp8_dtype).
    Forward only (its backward is that of the plain activation)."""
    return _ops.activation_fp8(input, bias, activation, limit, alpha, scale, fp8_dtype)


def activation_grad_fp8(grad_output: Tensor, input: Tensor, activation: str, scale: Tensor, fp8_dtype: torch.dtype,
                        with_transpose: bool, limit: float = _LIMIT,
                        alpha: float = _ALPHA) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    """(data, data_t or None, amax): the gradient of activation(input, activation) for
    grad_output (no bias) as saturate(grad_input * scale) in fp8_dtype, its transpose [H, rows]
    with with_transpose, and max |grad_input|, in one pass that never writes grad_input: bit
    for bit fp8_quantize_transpose(activation_grad(...)[0], scale, fp8_dtype). Outside autograd."""
    data, data_t, amax = _ops.activation_bwd_fp8(grad_output.contiguous(), input, activation, limit, alpha, scale,
                                                 fp8_dtype, with_transpose)
    return data, data_t if with_transpose else None, amax


def gelu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x * (0.5 + 0.5 tanh(sqrt(2/pi) (x + 0.044715 x^3))) of x = input + bias."""
    return activation(input, "gelu", bias)


def qgelu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x * sigmoid(1.702 x) of x = input + bias."""
    return activation(input, "qgelu", bias)


def relu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """max(x, 0) of x = input + bias."""
    return activation(input, "relu", bias)


def srelu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """max(x, 0)^2 of x = input + bias."""
    return activation(input, "srelu", bias)


def silu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x * sigmoid(x) of x = input + bias."""
    return activation(input, "silu", bias)


def glu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """sigmoid(a) * b for [a, b] = input + bias split along the last dimension."""
    return activation(input, "glu", bias)


def geglu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """gelu(a) * b for [a, b] = input + bias split along the last dimension."""
    return activation(input, "geglu", bias)


def qgeglu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """qgelu(a) * b for [a, b] = input + bias split along the last dimension."""
    return activation(input, "qgeglu", bias)


def reglu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """relu(a) * b for [a, b] = input + bias split along the last dimension."""
    return activation(input, "reglu", bias)


def sreglu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """srelu(a) * b for [a, b] = input + bias split along the last dimension."""
    return activation(input, "sreglu", bias)


def swiglu(input: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """silu(a) * b for [a, b] = input + bias split along the last dimension."""
    return activation(input, "swiglu", bias)


def clamped_swiglu(input: Tensor, bias: Optional[Tensor] = None, limit: float = _LIMIT,
                   alpha: float = _ALPHA) -> Tensor:
    """a' sigmoid(alpha a') (b' + 1) with a' = min(a, limit), b' = clamp(b, -limit, limit), for
    [a, b] = input + bias split along the last dimension."""
    return activation(input, "clamped_swiglu", bias, limit, alpha)
