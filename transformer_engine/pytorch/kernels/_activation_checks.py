"""Argument checks of the activation ops (bindings/activation_ops.cpp's, in Python, in the same
order and with the same messages): run by their fake kernels and before the Triton kernels or
the reference on accelerators. One function per op, taking the op's arguments and returning
the shape of the activation's output."""
from typing import Optional, Tuple

from torch import Tensor

from ..reference.activation import GATED, PLAIN
from . import _checks
from ._checks import fail, shape_text


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


def activation_fwd(input, bias, activation, limit, alpha):
    _activation("activation_fwd", activation, limit)
    return _input("activation_fwd", input, bias, activation)


def activation_bwd(grad_output, input, bias, activation, limit, alpha):
    _activation("activation_bwd", activation, limit)
    out_shape = _input("activation_bwd", input, bias, activation)
    _grad_output("activation_bwd", grad_output, input, out_shape)
    return out_shape


def activation_bwd_dbias(grad_output, input, bias, activation, limit, alpha):
    _activation("activation_bwd_dbias", activation, limit)
    out_shape = _input("activation_bwd_dbias", input, bias, activation)
    _grad_output("activation_bwd_dbias", grad_output, input, out_shape)
    return out_shape


def activation_fp8(input, bias, activation, limit, alpha, scale, fp8_dtype):
    op = "activation_fp8"
    _activation(op, activation, limit)
    out_shape = _input(op, input, bias, activation)
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.per_tensor_scale(op, "scale", scale, "input", input)
    return out_shape
