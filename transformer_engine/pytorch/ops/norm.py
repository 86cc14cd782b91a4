"""LayerNorm and RMSNorm as dispatcher ops: fake kernels for tracing and autograd rules.

The ops (schemas in bindings/schemas.cpp):
    layernorm_fwd(input, weight, bias?, eps, zero_centered_gamma) -> (output, mean, rstd)
    layernorm_bwd(grad_output, input, mean, rstd, weight, zero_centered_gamma)
        -> (grad_input, grad_weight, grad_bias)
    rmsnorm_fwd(input, weight, eps, zero_centered_gamma) -> (output, rstd)
    rmsnorm_bwd(grad_output, input, rstd, weight, zero_centered_gamma) -> (grad_input, grad_weight)
input [..., H]; weight, bias [H]; mean, rstd [...] in float32 (float64 for float64 input).
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ..reference.norm import stats_dtype
from ._registry import serve_reference_where_no_kernel

_ops = getattr(torch.ops, NAMESPACE)


def _stats_like(input: Tensor) -> Tensor:
    return input.new_empty(input.shape[:-1], dtype=stats_dtype(input.dtype))


def _check_same_device(op: str, input: Tensor, **others: Optional[Tensor]) -> None:
    """The dispatcher sends a call that mixes meta and real tensors to the fake kernel, so the
    fake kernels repeat the compiled kernels' device check."""
    for name, tensor in others.items():
        if tensor is not None and tensor.device != input.device:
            raise ValueError(f"{op}: {name} is on {tensor.device} but input is on {input.device}; "
                             "move them to the same device")


@torch.library.register_fake(f"{NAMESPACE}::layernorm_fwd")
def _layernorm_fwd_fake(input, weight, bias, eps, zero_centered_gamma):
    _check_same_device("layernorm_fwd", input, weight=weight, bias=bias)
    return input.new_empty(input.shape), _stats_like(input), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::layernorm_bwd")
def _layernorm_bwd_fake(grad_output, input, mean, rstd, weight, zero_centered_gamma):
    _check_same_device("layernorm_bwd", input, grad_output=grad_output, mean=mean, rstd=rstd, weight=weight)
    return input.new_empty(input.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_fwd")
def _rmsnorm_fwd_fake(input, weight, eps, zero_centered_gamma):
    _check_same_device("rmsnorm_fwd", input, weight=weight)
    return input.new_empty(input.shape), _stats_like(input)


@torch.library.register_fake(f"{NAMESPACE}::rmsnorm_bwd")
def _rmsnorm_bwd_fake(grad_output, input, rstd, weight, zero_centered_gamma):
    _check_same_device("rmsnorm_bwd", input, grad_output=grad_output, rstd=rstd, weight=weight)
    return input.new_empty(input.shape), weight.new_empty(weight.shape)


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
for _name in ("layernorm_bwd", "rmsnorm_bwd"):
    torch.library.register_autograd(f"{NAMESPACE}::{_name}", _no_double_backward(_name))

for _name in ("layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name))


def layernorm(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, eps: float = 1e-5,
              zero_centered_gamma: bool = False) -> Tensor:
    """LayerNorm over the last dimension; differentiable in input, weight and bias."""
    return _ops.layernorm_fwd(input, weight, bias, eps, zero_centered_gamma)[0]


def rmsnorm(input: Tensor, weight: Tensor, eps: float = 1e-5, zero_centered_gamma: bool = False) -> Tensor:
    """RMSNorm over the last dimension; differentiable in input and weight."""
    return _ops.rmsnorm_fwd(input, weight, eps, zero_centered_gamma)[0]
