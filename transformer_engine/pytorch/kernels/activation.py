"""Activations as dispatcher ops, with a fused bias and its gradient, and a fused FP8 cast.

The ops (schemas in bindings/schemas.cpp; semantics in reference/activation.py):
    activation_fwd(input, bias?, activation, limit, alpha) -> output
    activation_bwd(grad_output, input, bias?, activation, limit, alpha) -> grad_input
    activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha) -> (grad_input, grad_bias)
    activation_fp8(input, bias?, activation, limit, alpha, scale, fp8_dtype) -> (data, amax)
input [..., H]; bias, grad_bias [H]; output and grad_output [..., H], or [..., H/2] for the
gated (*glu) activations. limit and alpha are clamped_swiglu's (the others ignore them).
The backward ops recompute the activation from input: the forward saves no output.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _activation_checks
from ._registry import serve_reference_where_no_kernel
from .norm import _no_double_backward

_ops = getattr(torch.ops, NAMESPACE)
_LIMIT, _ALPHA = 7.0, 1.702  # clamped_swiglu's defaults


@torch.library.register_fake(f"{NAMESPACE}::activation_fwd")
def _activation_fwd_fake(input, bias, activation, limit, alpha):
    return input.new_empty(_activation_checks.activation_fwd(input, bias, activation, limit, alpha))


@torch.library.register_fake(f"{NAMESPACE}::activation_bwd")
def _activation_bwd_fake(grad_output, input, bias, activation, limit, alpha):
    _activation_checks.activation_bwd(grad_output, input, bias, activation, limit, alpha)
    return input.new_empty(input.shape)


@torch.library.register_fake(f"{NAMESPACE}::activation_bwd_dbias")
def _activation_bwd_dbias_fake(grad_output, input, bias, activation, limit, alpha):
    _activation_checks.activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha)
    return input.new_empty(input.shape), bias.new_empty(bias.shape)


@torch.library.register_fake(f"{NAMESPACE}::activation_fp8")
def _activation_fp8_fake(input, bias, activation, limit, alpha, scale, fp8_dtype):
    out_shape = _activation_checks.activation_fp8(input, bias, activation, limit, alpha, scale, fp8_dtype)
    return input.new_empty(out_shape, dtype=fp8_dtype), input.new_empty((), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    input, bias, activation, limit, alpha = inputs
    ctx.save_for_backward(input, bias)
    ctx.activation, ctx.limit, ctx.alpha = activation, limit, alpha


def _backward(ctx, grad_output):
    input, bias = ctx.saved_tensors
    args = (ctx.activation, ctx.limit, ctx.alpha)
    if bias is not None and ctx.needs_input_grad[1]:
        grad_input, grad_bias = _ops.activation_bwd_dbias(grad_output, input, bias, *args)
        return grad_input, grad_bias, None, None, None
    return _ops.activation_bwd(grad_output, input, bias, *args), None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::activation_fwd", _backward, setup_context=_setup_context)
for _name in ("activation_bwd", "activation_bwd_dbias"):
    torch.library.register_autograd(f"{NAMESPACE}::{_name}", _no_double_backward(_name))

for _name in ("activation_fwd", "activation_bwd", "activation_bwd_dbias", "activation_fp8"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name), triton_module="activation",
                                    check=getattr(_activation_checks, _name))


def activation(input: Tensor, activation: str, bias: Optional[Tensor] = None, limit: float = _LIMIT,
               alpha: float = _ALPHA) -> Tensor:
    """act(input + bias) by name (see the module docstring); differentiable in input and bias."""
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
