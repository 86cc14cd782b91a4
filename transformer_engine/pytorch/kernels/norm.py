"""LayerNorm and RMSNorm as dispatcher ops: fake kernels for tracing and autograd rules.

The ops (schemas in bindings/schemas.cpp):
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
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ..reference.norm import stats_dtype
from . import _norm_checks
from ._registry import serve_reference_where_no_kernel

_ops = getattr(torch.ops, NAMESPACE)


def _stats_like(input: Tensor) -> Tensor:
    return input.new_empty(input.shape[:-1], dtype=stats_dtype(input.dtype))


@torch.library.register_fake(f"{NAMESPACE}::layernorm_fwd")
def _layernorm_fwd_fake(input, weight, bias, eps, zero_centered_gamma):
    _norm_checks.layernorm_fwd(input, weight, bias, eps, zero_centered_gamma)
    return input.new_empty(input.shape), _stats_like(input), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::layernorm_bwd")
def _layernorm_bwd_fake(grad_output, input, mean, rstd, weight, zero_centered_gamma):
    _norm_checks.layernorm_bwd(grad_output, input, mean, rstd, weight, zero_centered_gamma)
    return input.new_empty(input.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_fwd")
def _rmsnorm_fwd_fake(input, weight, eps, zero_centered_gamma):
    _norm_checks.rmsnorm_fwd(input, weight, eps, zero_centered_gamma)
    return input.new_empty(input.shape), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_bwd")
def _rmsnorm_bwd_fake(grad_output, input, rstd, weight, zero_centered_gamma):
    _norm_checks.rmsnorm_bwd(grad_output, input, rstd, weight, zero_centered_gamma)
    return input.new_empty(input.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::add_layernorm_fwd")
def _add_layernorm_fwd_fake(input, residual, weight, bias, eps, zero_centered_gamma):
    _norm_checks.add_layernorm_fwd(input, residual, weight, bias, eps, zero_centered_gamma)
    return input.new_empty(input.shape), input.new_empty(input.shape), _stats_like(input), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::add_layernorm_bwd")
def _add_layernorm_bwd_fake(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma):
    _norm_checks.add_layernorm_bwd(grad_output, grad_sum, sum, mean, rstd, weight, zero_centered_gamma)
    return sum.new_empty(sum.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::add_rmsnorm_fwd")
def _add_rmsnorm_fwd_fake(input, residual, weight, eps, zero_centered_gamma):
    _norm_checks.add_rmsnorm_fwd(input, residual, weight, eps, zero_centered_gamma)
    return input.new_empty(input.shape), input.new_empty(input.shape), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::add_rmsnorm_bwd")
def _add_rmsnorm_bwd_fake(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma):
    _norm_checks.add_rmsnorm_bwd(grad_output, grad_sum, sum, rstd, weight, zero_centered_gamma)
    return sum.new_empty(sum.shape), weight.new_empty(weight.shape)


def _fp8_outputs_like(input: Tensor, fp8_dtype: torch.dtype, return_output: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(data, amax, output) of a norm -> FP8 forward."""
    output = input.new_empty(input.shape if return_output else (0,))
    return input.new_empty(input.shape, dtype=fp8_dtype), input.new_empty((), dtype=torch.float32), output


@torch.library.register_fake(f"{NAMESPACE}::layernorm_fp8_fwd")
def _layernorm_fp8_fwd_fake(input, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _norm_checks.layernorm_fp8_fwd(input, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
    data, amax, output = _fp8_outputs_like(input, fp8_dtype, return_output)
    return data, amax, _stats_like(input), _stats_like(input), output


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_fp8_fwd")
def _rmsnorm_fp8_fwd_fake(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output):
    _norm_checks.rmsnorm_fp8_fwd(input, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
    data, amax, output = _fp8_outputs_like(input, fp8_dtype, return_output)
    return data, amax, _stats_like(input), output


def _layernorm_setup_context(ctx, inputs, output):
    input, weight, bias, _eps, zero_centered_gamma = inputs
    _, mean, rstd = output
    ctx.save_for_backward(input, weight, mean, rstd)
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(mean, rstd)


def _layernorm_backward(ctx, grad_output, _grad_mean, _grad_rstd):
    input, weight, mean, rstd = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = _ops.layernorm_bwd(
        grad_output, input, mean, rstd, weight, ctx.zero_centered_gamma)
    return grad_input, grad_weight, grad_bias if ctx.has_bias else None, None, None


def _rmsnorm_setup_context(ctx, inputs, output):
    input, weight, _eps, zero_centered_gamma = inputs
    _, rstd = output
    ctx.save_for_backward(input, weight, rstd)
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.mark_non_differentiable(rstd)


def _rmsnorm_backward(ctx, grad_output, _grad_rstd):
    input, weight, rstd = ctx.saved_tensors
    grad_input, grad_weight = _ops.rmsnorm_bwd(grad_output, input, rstd, weight, ctx.zero_centered_gamma)
    return grad_input, grad_weight, None, None


def _add_layernorm_setup_context(ctx, inputs, output):
    _input, _residual, weight, bias, _eps, zero_centered_gamma = inputs
    _, sum, mean, rstd = output
    ctx.save_for_backward(sum, weight, mean, rstd)
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(mean, rstd)


def _add_layernorm_backward(ctx, grad_output, grad_sum, _grad_mean, _grad_rstd):
    sum, weight, mean, rstd = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = _ops.add_layernorm_bwd(
        grad_output, grad_sum, sum, mean, rstd, weight, ctx.zero_centered_gamma)
    # d(input + residual)/d input = d/d residual = identity: both get grad_input.
    return grad_input, grad_input, grad_weight, grad_bias if ctx.has_bias else None, None, None


def _add_rmsnorm_setup_context(ctx, inputs, output):
    _input, _residual, weight, _eps, zero_centered_gamma = inputs
    _, sum, rstd = output
    ctx.save_for_backward(sum, weight, rstd)
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.mark_non_differentiable(rstd)


def _add_rmsnorm_backward(ctx, grad_output, grad_sum, _grad_rstd):
    sum, weight, rstd = ctx.saved_tensors
    grad_input, grad_weight = _ops.add_rmsnorm_bwd(grad_output, grad_sum, sum, rstd, weight, ctx.zero_centered_gamma)
    return grad_input, grad_input, grad_weight, None, None


def _no_double_backward(op: str):
    """Autograd rule for a backward op: differentiating it again (create_graph=True, e.g. a
    gradient penalty) raises instead of silently treating the gradient as a constant."""
    def backward(ctx, *grads):
        raise NotImplementedError(f"{op}: double backward (gradients of gradients) is not supported; "
                                  "use the reference ops in transformer_engine.pytorch.reference")
    return backward


torch.library.register_autograd(f"{NAMESPACE}::layernorm_fwd", _layernorm_backward,
                                setup_context=_layernorm_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::rmsnorm_fwd", _rmsnorm_backward,
                                setup_context=_rmsnorm_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::add_layernorm_fwd", _add_layernorm_backward,
                                setup_context=_add_layernorm_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::add_rmsnorm_fwd", _add_rmsnorm_backward,
                                setup_context=_add_rmsnorm_setup_context)
for _name in ("layernorm_bwd", "rmsnorm_bwd", "add_layernorm_bwd", "add_rmsnorm_bwd"):
    torch.library.register_autograd(f"{NAMESPACE}::{_name}", _no_double_backward(_name))

for _name in ("layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "add_layernorm_fwd", "add_layernorm_bwd",
              "add_rmsnorm_fwd", "add_rmsnorm_bwd", "layernorm_fp8_fwd", "rmsnorm_fp8_fwd"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name), triton_module="norm",
                                    check=getattr(_norm_checks, _name))


def layernorm(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, eps: float = 1e-5,
              zero_centered_gamma: bool = False) -> Tensor:
    """LayerNorm over the last dimension; differentiable in input, weight and bias."""
    return _ops.layernorm_fwd(input, weight, bias, eps, zero_centered_gamma)[0]


def rmsnorm(input: Tensor, weight: Tensor, eps: float = 1e-5, zero_centered_gamma: bool = False) -> Tensor:
    """RMSNorm over the last dimension; differentiable in input and weight."""
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
