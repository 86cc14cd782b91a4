"""Argument checks of the norm ops (bindings/norm_ops.cpp's, in Python): run by their fake
kernels and before the Triton kernels or the reference on accelerators: one function per op,
taking the op's arguments."""
from typing import Optional

from torch import Tensor

from ..reference.norm import stats_dtype
from . import _checks
from ._checks import fail, shape_text


def _params(op: str, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> int:
    """The normalized size, after checking the parameters fit input [..., H]."""
    _checks.kernel_dtype(op, "input", input)
    if input.dim() < 1:
        fail(op, "input must have at least one dimension (the normalized one), got a 0-d tensor")
    hidden = input.shape[-1]
    if hidden == 0:
        fail(op, "the normalized (last) dimension of input must be non-empty, input has shape "
                 f"{shape_text(input.shape)}")
    _checks.kernel_dtype(op, "weight", weight)
    _checks.same_device(op, "weight", weight, "input", input)
    _checks.shape(op, "weight", weight, (hidden,), "the normalized size is input's last dimension")
    if bias is not None:
        _checks.same_device(op, "bias", bias, "input", input)
        _checks.dtype(op, "bias", bias, weight.dtype)
        _checks.shape(op, "bias", bias, (hidden,), "the normalized size is input's last dimension")
    return hidden


def _eps(op: str, eps: float) -> None:
    if not eps >= 0:
        fail(op, f"eps must be non-negative, got {eps}")


def _backward(op: str, grad_output: Tensor, input: Tensor, mean: Optional[Tensor], rstd: Tensor) -> None:
    _checks.same_device(op, "grad_output", grad_output, "input", input)
    _checks.dtype(op, "grad_output", grad_output, input.dtype)
    _checks.shape(op, "grad_output", grad_output, input.shape, "it must match input")
    for name, stat in (("mean", mean), ("rstd", rstd)):
        if stat is not None:
            _checks.same_device(op, name, stat, "input", input)
            _checks.dtype(op, name, stat, stats_dtype(input.dtype))
            _checks.shape(op, name, stat, input.shape[:-1], "one statistic per row of input")


def _residual(op: str, residual: Tensor, input: Tensor) -> None:
    _checks.same_device(op, "residual", residual, "input", input)
    _checks.dtype(op, "residual", residual, input.dtype)
    _checks.shape(op, "residual", residual, input.shape, "it must match input")


def _grad_sum(op: str, grad_sum: Tensor, sum: Tensor) -> None:
    _checks.same_device(op, "grad_sum", grad_sum, "sum", sum)
    _checks.dtype(op, "grad_sum", grad_sum, sum.dtype)
    _checks.shape(op, "grad_sum", grad_sum, sum.shape, "it must match sum")


def _fp8_output(op: str, input: Tensor, scale: Tensor, fp8_dtype) -> None:
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.high_precision_dtype(op, "input", input.dtype)
    _checks.per_tensor_scale(op, "scale", scale, "input", input)


def layernorm_fwd(input, weight, bias, eps, zero_centered_gamma):
    _params("layernorm_fwd", input, weight, bias)
    _eps("layernorm_fwd", eps)


def layernorm_bwd(grad_output, input, mean, rstd, weight, zero_centered_gamma):
    _params("layernorm_bwd", input, weight, None)
    _backward("layernorm_bwd", grad_output, input, mean, rstd)


def rmsnorm_fwd(input, weight, eps, zero_centered_gamma):
    _params("rmsnorm_fwd", input, weight, None)
    _eps("rmsnorm_fwd", eps)


def rmsnorm_bwd(grad_output, input, rstd, weight, zero_centered_gamma):
    _params("rmsnorm_bwd", input, weight, None)
    _backward("rmsnorm_bwd", grad_output, input, None, rstd)


def add_layernorm_fwd(input, residual, weight, bias, eps, zero_centered_gamma):
    _params("add_layernorm_fwd", input, weight, bias)
    _residual("add_layernorm_fwd", residual, input)
    _eps("add_layernorm_fwd", eps)


def add_layernorm_bwd(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma):
    _params("add_layernorm_bwd", sum, weight, None)
    _backward("add_layernorm_bwd", grad_output, sum, mean, rstd)
    _grad_sum("add_layernorm_bwd", grad_sum, sum)


def add_rmsnorm_fwd(input, residual, weight, eps, zero_centered_gamma):
    _params("add_rmsnorm_fwd", input, weight, None)
    _residual("add_rmsnorm_fwd", residual, input)
    _eps("add_rmsnorm_fwd", eps)


def add_rmsnorm_bwd(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma):
    _params("add_rmsnorm_bwd", sum, weight, None)
    _backward("add_rmsnorm_bwd", grad_output, sum, None, rstd)
    _grad_sum("add_rmsnorm_bwd", grad_sum, sum)


def layernorm_fp8_fwd(input, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _params("layernorm_fp8_fwd", input, weight, bias)
    _fp8_output("layernorm_fp8_fwd", input, scale, fp8_dtype)
    _eps("layernorm_fp8_fwd", eps)


def rmsnorm_fp8_fwd(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _params("rmsnorm_fp8_fwd", input, weight, None)
    _fp8_output("rmsnorm_fp8_fwd", input, scale, fp8_dtype)
    _eps("rmsnorm_fp8_fwd", eps)
