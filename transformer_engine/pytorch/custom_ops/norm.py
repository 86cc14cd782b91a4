"""LayerNorm and RMSNorm as dispatcher ops: fake kernels for tracing (their autograd is C++:
bindings/norm_ops.cpp).

The ops (schemas in bindings/norm_ops.cpp):
    layernorm_fwd(input, weight, bias?, eps, zero_centered_gamma) -> (output, mean, rstd)
    layernorm_bwd(grad_output, input, mean, rstd, weight, zero_centered_gamma)
        -> (grad_input, grad_weight, grad_bias)
    rmsnorm_fwd(input, weight, eps, zero_centered_gamma) -> (output, rstd)
    rmsnorm_bwd(grad_output, input, rstd, weight, zero_centered_gamma) -> (grad_input, grad_weight)
Residual add fused with the norm (sum = input + residual in input's dtype, output = norm(sum);
grad_input = norm_backward(grad_output) + grad_sum is the gradient of input and residual alike):
    add_layernorm_fwd(input, residual, weight, bias?, eps, zero_centered_gamma) -> (output, sum, mean, rstd)
    add_layernorm_bwd(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma)
        -> (grad_input, grad_weight, grad_bias)
    add_rmsnorm_fwd(input, residual, weight, eps, zero_centered_gamma) -> (output, sum, rstd)
    add_rmsnorm_bwd(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma) -> (grad_input, grad_weight)
Norm -> FP8, forward only (data = fp8_quantize(output, scale), amax = max |output|; output
itself only when return_output, else an empty [0] tensor; backward: *_bwd from mean/rstd):
    layernorm_fp8_fwd(input, weight, bias?, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
        -> (data, amax, mean, rstd, output)
    rmsnorm_fp8_fwd(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
        -> (data, amax, rstd, output)
input, residual, sum [..., H]; weight, bias [H]; mean, rstd [...] in float32 (float64 for
float64 input); scale one float32 element; amax a float32 scalar.

The argument checks below are bindings/norm_ops.cpp's, in Python: run by the fake kernels and
before the Triton kernels or the reference on accelerators.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE, kernels
from ..reference.norm import stats_dtype
from . import _checks
from ._checks import fail, shape_text
from ._registry import direct_call_applies, no_double_backward, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)


# --- argument checks (bindings/norm_ops.cpp's) ---------------------------------------------
def _check_params(op: str, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> int:
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


def _check_eps(op: str, eps: float) -> None:
    if not eps >= 0:
        fail(op, f"eps must be non-negative, got {eps}")


def _check_grad_and_stats(op: str, grad_output: Tensor, input: Tensor, mean: Optional[Tensor], rstd: Tensor) -> None:
    _checks.same_device(op, "grad_output", grad_output, "input", input)
    _checks.dtype(op, "grad_output", grad_output, input.dtype)
    _checks.shape(op, "grad_output", grad_output, input.shape, "it must match input")
    for name, stat in (("mean", mean), ("rstd", rstd)):
        if stat is not None:
            _checks.same_device(op, name, stat, "input", input)
            _checks.dtype(op, name, stat, stats_dtype(input.dtype))
            _checks.shape(op, name, stat, input.shape[:-1], "one statistic per row of input")


def _check_residual(op: str, residual: Tensor, input: Tensor) -> None:
    _checks.same_device(op, "residual", residual, "input", input)
    _checks.dtype(op, "residual", residual, input.dtype)
    _checks.shape(op, "residual", residual, input.shape, "it must match input")


def _check_grad_sum(op: str, grad_sum: Tensor, sum: Tensor) -> None:
    _checks.same_device(op, "grad_sum", grad_sum, "sum", sum)
    _checks.dtype(op, "grad_sum", grad_sum, sum.dtype)
    _checks.shape(op, "grad_sum", grad_sum, sum.shape, "it must match sum")


def _check_fp8_output(op: str, input: Tensor, scale: Tensor, fp8_dtype) -> None:
    _checks.fp8_format(op, "fp8_dtype", fp8_dtype)
    _checks.high_precision_dtype(op, "input", input.dtype)
    _checks.per_tensor_scale(op, "scale", scale, "input", input)


def _check_layernorm_fwd(input, weight, bias, eps, zero_centered_gamma):
    _check_params("layernorm_fwd", input, weight, bias)
    _check_eps("layernorm_fwd", eps)


def _check_layernorm_bwd(grad_output, input, mean, rstd, weight, zero_centered_gamma):
    _check_params("layernorm_bwd", input, weight, None)
    _check_grad_and_stats("layernorm_bwd", grad_output, input, mean, rstd)


def _check_rmsnorm_fwd(input, weight, eps, zero_centered_gamma):
    _check_params("rmsnorm_fwd", input, weight, None)
    _check_eps("rmsnorm_fwd", eps)


def _check_rmsnorm_bwd(grad_output, input, rstd, weight, zero_centered_gamma):
    _check_params("rmsnorm_bwd", input, weight, None)
    _check_grad_and_stats("rmsnorm_bwd", grad_output, input, None, rstd)


def _check_add_layernorm_fwd(input, residual, weight, bias, eps, zero_centered_gamma):
    _check_params("add_layernorm_fwd", input, weight, bias)
    _check_residual("add_layernorm_fwd", residual, input)
    _check_eps("add_layernorm_fwd", eps)


def _check_add_layernorm_bwd(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma):
    _check_params("add_layernorm_bwd", sum, weight, None)
    _check_grad_and_stats("add_layernorm_bwd", grad_output, sum, mean, rstd)
    _check_grad_sum("add_layernorm_bwd", grad_sum, sum)


def _check_add_rmsnorm_fwd(input, residual, weight, eps, zero_centered_gamma):
    _check_params("add_rmsnorm_fwd", input, weight, None)
    _check_residual("add_rmsnorm_fwd", residual, input)
    _check_eps("add_rmsnorm_fwd", eps)


def _check_add_rmsnorm_bwd(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma):
    _check_params("add_rmsnorm_bwd", sum, weight, None)
    _check_grad_and_stats("add_rmsnorm_bwd", grad_output, sum, None, rstd)
    _check_grad_sum("add_rmsnorm_bwd", grad_sum, sum)


def _check_layernorm_fp8_fwd(input, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _check_params("layernorm_fp8_fwd", input, weight, bias)
    _check_fp8_output("layernorm_fp8_fwd", input, scale, fp8_dtype)
    _check_eps("layernorm_fp8_fwd", eps)


def _check_rmsnorm_fp8_fwd(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _check_params("rmsnorm_fp8_fwd", input, weight, None)
    _check_fp8_output("rmsnorm_fp8_fwd", input, scale, fp8_dtype)
    _check_eps("rmsnorm_fp8_fwd", eps)


def _stats_like(input: Tensor) -> Tensor:
    return input.new_empty(input.shape[:-1], dtype=stats_dtype(input.dtype))


@torch.library.register_fake(f"{NAMESPACE}::layernorm_fwd")
def _layernorm_fwd_fake(input, weight, bias, eps, zero_centered_gamma):
    _check_layernorm_fwd(input, weight, bias, eps, zero_centered_gamma)
    return input.new_empty(input.shape), _stats_like(input), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::layernorm_bwd")
def _layernorm_bwd_fake(grad_output, input, mean, rstd, weight, zero_centered_gamma):
    _check_layernorm_bwd(grad_output, input, mean, rstd, weight, zero_centered_gamma)
    return input.new_empty(input.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_fwd")
def _rmsnorm_fwd_fake(input, weight, eps, zero_centered_gamma):
    _check_rmsnorm_fwd(input, weight, eps, zero_centered_gamma)
    return input.new_empty(input.shape), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_bwd")
def _rmsnorm_bwd_fake(grad_output, input, rstd, weight, zero_centered_gamma):
    _check_rmsnorm_bwd(grad_output, input, rstd, weight, zero_centered_gamma)
    return input.new_empty(input.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::add_layernorm_fwd")
def _add_layernorm_fwd_fake(input, residual, weight, bias, eps, zero_centered_gamma):
    _check_add_layernorm_fwd(input, residual, weight, bias, eps, zero_centered_gamma)
    return input.new_empty(input.shape), input.new_empty(input.shape), _stats_like(input), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::add_layernorm_bwd")
def _add_layernorm_bwd_fake(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma):
    _check_add_layernorm_bwd(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma)
    return sum.new_empty(sum.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::add_rmsnorm_fwd")
def _add_rmsnorm_fwd_fake(input, residual, weight, eps, zero_centered_gamma):
    _check_add_rmsnorm_fwd(input, residual, weight, eps, zero_centered_gamma)
    return input.new_empty(input.shape), input.new_empty(input.shape), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::add_rmsnorm_bwd")
def _add_rmsnorm_bwd_fake(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma):
    _check_add_rmsnorm_bwd(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma)
    return sum.new_empty(sum.shape), weight.new_empty(weight.shape)


def _fp8_outputs_like(input: Tensor, fp8_dtype: torch.dtype, return_output: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(data, amax, output) of a norm -> FP8 forward."""
    output = input.new_empty(input.shape if return_output else (0,))
    return input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty((), dtype=torch.float32), output


@torch.library.register_fake(f"{NAMESPACE}::layernorm_fp8_fwd")
def _layernorm_fp8_fwd_fake(input, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _check_layernorm_fp8_fwd(input, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
    data, amax, output = _fp8_outputs_like(input, fp8_dtype, return_output)
    return data, amax, _stats_like(input), _stats_like(input), output


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_fp8_fwd")
def _rmsnorm_fp8_fwd_fake(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _check_rmsnorm_fp8_fwd(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
    data, amax, output = _fp8_outputs_like(input, fp8_dtype, return_output)
    return data, amax, _stats_like(input), output


# The forward ops' autograd kernels are C++ (bindings/norm_ops.cpp: a Python formula costs
# several times the kernel on small inputs); their backward ops get this refusal.
for _name in ("layernorm_bwd", "rmsnorm_bwd", "add_layernorm_bwd", "add_rmsnorm_bwd"):
    torch.library.register_autograd(f"{NAMESPACE}::{_name}", no_double_backward(_name))

serve_on_accelerators("layernorm_fwd", reference.layernorm_fwd, triton_module="norm", check=_check_layernorm_fwd)
serve_on_accelerators("layernorm_bwd", reference.layernorm_bwd, triton_module="norm", check=_check_layernorm_bwd)
serve_on_accelerators("rmsnorm_fwd", reference.rmsnorm_fwd, triton_module="norm", check=_check_rmsnorm_fwd)
serve_on_accelerators("rmsnorm_bwd", reference.rmsnorm_bwd, triton_module="norm", check=_check_rmsnorm_bwd)
serve_on_accelerators("add_layernorm_fwd", reference.add_layernorm_fwd, triton_module="norm",
                      check=_check_add_layernorm_fwd)
serve_on_accelerators("add_layernorm_bwd", reference.add_layernorm_bwd, triton_module="norm",
                      check=_check_add_layernorm_bwd)
serve_on_accelerators("add_rmsnorm_fwd", reference.add_rmsnorm_fwd, triton_module="norm", check=_check_add_rmsnorm_fwd)
serve_on_accelerators("add_rmsnorm_bwd", reference.add_rmsnorm_bwd, triton_module="norm", check=_check_add_rmsnorm_bwd)
serve_on_accelerators("layernorm_fp8_fwd", reference.layernorm_fp8_fwd, triton_module="norm",
                      check=_check_layernorm_fp8_fwd)
serve_on_accelerators("rmsnorm_fp8_fwd", reference.rmsnorm_fp8_fwd, triton_module="norm",
                      check=_check_rmsnorm_fp8_fwd)


def layernorm(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, eps: float = 1e-5,
              zero_centered_gamma: bool = False) -> Tensor:
    """LayerNorm over the last dimension; differentiable in input, weight and bias."""
    if direct_call_applies((input, weight, bias)):
        return kernels.direct.layernorm(input, weight, bias, eps, zero_centered_gamma)
    return _ops.layernorm_fwd(input, weight, bias, eps, zero_centered_gamma)[0]


def rmsnorm(input: Tensor, weight: Tensor, eps: float = 1e-5, zero_centered_gamma: bool = False) -> Tensor:
    """RMSNorm over the last dimension; differentiable in input and weight."""
    if direct_call_applies((input, weight)):
        return kernels.direct.rmsnorm(input, weight, eps, zero_centered_gamma)
    return _ops.rmsnorm_fwd(input, weight, eps, zero_centered_gamma)[0]


def add_layernorm(input: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor] = None, eps: float = 1e-5,
                  zero_centered_gamma: bool = False) -> Tuple[Tensor, Tensor]:
    """(layernorm(s), s) with s = input + residual (the next residual stream), in one pass;
    differentiable in input, residual, weight and bias."""
    output, sum, _, _ = _ops.add_layernorm_fwd(input, residual, weight, bias, eps, zero_centered_gamma)
    return output, sum


def add_rmsnorm(input: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-5,
                zero_centered_gamma: bool = False) -> Tuple[Tensor, Tensor]:
    """(rmsnorm(s), s) with s = input + residual (the next residual stream), in one pass;
    differentiable in input, residual and weight."""
    output, sum, _ = _ops.add_rmsnorm_fwd(input, residual, weight, eps, zero_centered_gamma)
    return output, sum


def layernorm_fp8(input: Tensor, weight: Tensor, bias: Optional[Tensor], scale: Tensor, fp8_dtype: torch.dtype,
                  eps: float = 1e-5, zero_centered_gamma: bool = False,
                  return_output: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
    """LayerNorm straight to FP8, forward only: (data, amax, mean, rstd, output) with data =
    fp8_quantize(output, scale, fp8_dtype)'s codes, amax = max |output| and output (input's
    dtype) only when return_output, else None. The backward is layernorm_bwd from mean/rstd."""
    data, amax, mean, rstd, output = _ops.layernorm_fp8_fwd(input, weight, bias, scale, fp8_dtype, eps,
                                                            zero_centered_gamma, return_output)
    return data, amax, mean, rstd, output if return_output else None


def rmsnorm_fp8(input: Tensor, weight: Tensor, scale: Tensor, fp8_dtype: torch.dtype, eps: float = 1e-5,
                zero_centered_gamma: bool = False,
                return_output: bool = False) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """RMSNorm straight to FP8, forward only: (data, amax, rstd, output), as layernorm_fp8.
    The backward is rmsnorm_bwd from rstd."""
    data, amax, rstd, output = _ops.rmsnorm_fp8_fwd(input, weight, scale, fp8_dtype, eps, zero_centered_gamma,
                                                    return_output)
    return data, amax, rstd, output if return_output else None
