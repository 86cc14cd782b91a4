"""Activations in plain PyTorch, with the ops' signatures and semantics (TE_API.md section 3).

input [..., H]; bias [H] or None, added to input before the activation (a Linear's bias).
Plain activations (gelu, qgelu, relu, srelu, silu) give [..., H]; gated ones (glu, geglu,
qgeglu, reglu, sreglu, swiglu, clamped_swiglu) split H into halves a, b and give [..., H/2]
= act(a) * b, or for clamped_swiglu act(min(a, limit)) * (clamp(b, -limit, limit) + 1) with
act(x) = x * sigmoid(alpha * x). Math in fp32, results in input's dtype; the backward
recomputes the activation from input and bias, with the derivatives written out (so that
these functions also serve as the implementation on devices without a kernel). They do not
check their arguments: there the op's checks (custom_ops/activation.py) have refused bad ones
first, and the direct callers (the tests' oracle, te-bench, code differentiating twice as the
backward ops' error suggests) pass arguments the op takes.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .fp8_cast import fp8_quantize, fp8_quantize_transpose

PLAIN = ("gelu", "qgelu", "relu", "srelu", "silu")
GATED = ("glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu")
GATE_OF = {"glu": "sigmoid", "geglu": "gelu", "qgeglu": "qgelu", "reglu": "relu", "sreglu": "srelu",
           "swiglu": "silu", "clamped_swiglu": "clamped_silu"}
QGELU_ALPHA = 1.702
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def output_shape(input: Tensor, activation: str) -> Tuple[int, ...]:
    """The shape of the activation's output (and of grad_output): input's, halved in the last
    dimension for a gated activation."""
    return (*input.shape[:-1], input.shape[-1] // 2) if activation in GATED else tuple(input.shape)


def _value_and_derivative(fn: str, x: Tensor, limit: float, alpha: float) -> Tuple[Tensor, Tensor]:
    """(f(x), f'(x)) of the function applied to a plain input or a gated input's a half."""
    if fn == "gelu":
        # 0.5 x (1 + tanh(u)) written as x sigmoid(2u): 1 + tanh(u) cancels to nothing where
        # tanh(u) rounds to -1 (u < -4.5 or so: x < -3.7), and torch.tanh was seen to give
        # exactly -1 there in some runs, making the reference 0 against a true -1.7e-4.
        u = _SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
        s = torch.sigmoid(2 * u)  # = (1 + tanh(u)) / 2
        du_dx = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return x * s, s + 2 * x * s * (1 - s) * du_dx
    if fn in ("qgelu", "silu", "clamped_silu"):
        slope = QGELU_ALPHA if fn == "qgelu" else 1.0 if fn == "silu" else alpha
        clamped = x.clamp(max=limit) if fn == "clamped_silu" else x
        s = torch.sigmoid(slope * clamped)
        derivative = s * (1 + slope * clamped * (1 - s))
        if fn == "clamped_silu":
            derivative = torch.where(x > limit, 0.0, derivative)
        return clamped * s, derivative
    if fn == "sigmoid":
        s = torch.sigmoid(x)
        return s, s * (1 - s)
    r = F.relu(x)
    if fn == "relu":
        return r, (x > 0).to(x.dtype)
    return r * r, 2 * r  # srelu


def _linear_value_and_derivative(activation: str, b: Tensor, limit: float) -> Tuple[Tensor, Tensor]:
    if activation != "clamped_swiglu":
        return b, torch.ones_like(b)
    inside = (b >= -limit) & (b <= limit)
    return b.clamp(-limit, limit) + 1, inside.to(b.dtype)


def _pre_activation(input: Tensor, bias: Optional[Tensor]) -> Tensor:
    x = input.float()
    return x + bias.float() if bias is not None else x


def activation_fwd(input: Tensor, bias: Optional[Tensor], activation: str, limit: float = 7.0,
                   alpha: float = 1.702) -> Tensor:
    x = _pre_activation(input, bias)
    if activation in PLAIN:
        return _value_and_derivative(activation, x, limit, alpha)[0].to(input.dtype)
    a, b = x.chunk(2, dim=-1)
    gate = _value_and_derivative(GATE_OF[activation], a, limit, alpha)[0]
    return (gate * _linear_value_and_derivative(activation, b, limit)[0]).to(input.dtype)


def _grad_pre_activation(grad_output: Tensor, input: Tensor, bias: Optional[Tensor], activation: str,
                         limit: float, alpha: float) -> Tensor:
    """The gradient w.r.t. input + bias, in fp32."""
    x, dy = _pre_activation(input, bias), grad_output.float()
    if activation in PLAIN:
        return dy * _value_and_derivative(activation, x, limit, alpha)[1]
    a, b = x.chunk(2, dim=-1)
    gate, d_gate = _value_and_derivative(GATE_OF[activation], a, limit, alpha)
    linear, d_linear = _linear_value_and_derivative(activation, b, limit)
    return torch.cat([dy * linear * d_gate, dy * gate * d_linear], dim=-1)


def activation_bwd(grad_output: Tensor, input: Tensor, bias: Optional[Tensor], activation: str, limit: float = 7.0,
                   alpha: float = 1.702) -> Tensor:
    return _grad_pre_activation(grad_output, input, bias, activation, limit, alpha).to(input.dtype)


def activation_bwd_dbias(grad_output: Tensor, input: Tensor, bias: Tensor, activation: str, limit: float = 7.0,
                         alpha: float = 1.702) -> Tuple[Tensor, Tensor]:
    grad = _grad_pre_activation(grad_output, input, bias, activation, limit, alpha)
    grad_bias = grad.reshape(-1, input.shape[-1]).sum(dim=0)
    return grad.to(input.dtype), grad_bias.to(bias.dtype)


def activation_fp8(input: Tensor, bias: Optional[Tensor], activation: str, limit: float, alpha: float, scale: Tensor,
                   fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """fp8_quantize of activation_fwd's output (rounded to input's dtype first)."""
    return fp8_quantize(activation_fwd(input, bias, activation, limit, alpha), scale, fp8_dtype)


def activation_bwd_fp8(grad_output: Tensor, input: Tensor, activation: str, limit: float, alpha: float, scale: Tensor,
                       fp8_dtype: torch.dtype, with_transpose: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """fp8_quantize_transpose of activation_bwd's input gradient (no bias; rounded to input's
    dtype first): (data, data_t [H, rows] or [0] without with_transpose, amax)."""
    grad_input = activation_bwd(grad_output, input, None, activation, limit, alpha)
    if with_transpose:
        return fp8_quantize_transpose(grad_input, scale, fp8_dtype)
    data, amax = fp8_quantize(grad_input, scale, fp8_dtype)
    return data, data.new_empty(0), amax
