"""Fused attention softmax (TE's ScaledSoftmax family) as dispatcher ops.

The ops (schemas in bindings/schemas.cpp):
    scaled_softmax_fwd(input, mask?, scale, mask_type) -> output
    scaled_softmax_bwd(grad_output, output, mask?, scale, mask_type) -> grad_input
input [b, h, sq, sk] (or [b*h, sq, sk] without a padding mask); math in float32, output in
input's dtype; the backward needs only the forward's output. Semantics: reference/softmax.py.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _softmax_checks
from ._registry import serve_reference_where_no_kernel
from .norm import _no_double_backward

_ops = getattr(torch.ops, NAMESPACE)


@torch.library.register_fake(f"{NAMESPACE}::scaled_softmax_fwd")
def _scaled_softmax_fwd_fake(input, mask, scale, mask_type):
    _softmax_checks.scaled_softmax_fwd(input, mask, scale, mask_type)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::scaled_softmax_bwd")
def _scaled_softmax_bwd_fake(grad_output, output, mask, scale, mask_type):
    _softmax_checks.scaled_softmax_bwd(grad_output, output, mask, scale, mask_type)
    return torch.empty_like(output, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    _input, mask, scale, mask_type = inputs
    ctx.save_for_backward(output, mask)
    ctx.scale, ctx.mask_type = scale, mask_type


def _backward(ctx, grad_output):
    output, mask = ctx.saved_tensors
    grad_input = _ops.scaled_softmax_bwd(grad_output, output, mask, ctx.scale, ctx.mask_type)
    return grad_input, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::scaled_softmax_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::scaled_softmax_bwd", _no_double_backward("scaled_softmax_bwd"))
for _name in ("scaled_softmax_fwd", "scaled_softmax_bwd"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name), triton_module="softmax",
                                    check=getattr(_softmax_checks, _name))


def scaled_softmax(input: Tensor, scale: float) -> Tensor:
    """softmax(scale * input) over the last dim; input [b, h, sq, sk] or [b*h, sq, sk]."""
    return _ops.scaled_softmax_fwd(input, None, scale, "none")


def scaled_masked_softmax(input: Tensor, mask: Optional[Tensor], scale: float) -> Tensor:
    """softmax over the last dim of scale * input with masked logits set to -10000 (TE's rule).

    input [b, h, sq, sk]; mask bool broadcastable as [b or 1, 1, sq, sk] (a head dim of h is
    accepted too), True = masked out. A fully masked row comes out uniform (1/sk), as in TE;
    its gradient, like every masked position's, is 0. mask=None is plain scaled_softmax.
    """
    if mask is None:
        return scaled_softmax(input, scale)
    return _ops.scaled_softmax_fwd(input, mask, scale, "padding")


def scaled_upper_triang_masked_softmax(input: Tensor, scale: float) -> Tensor:
    """Causal softmax, keys j > i dropped (output exactly 0); input [b*h, sq, sq] or
    [b, h, sq, sq]: square scores only."""
    return _ops.scaled_softmax_fwd(input, None, scale, "causal")


def scaled_aligned_causal_masked_softmax(input: Tensor, scale: float) -> Tensor:
    """Causal softmax aligned to the bottom-right corner: query i sees keys j <= i + (sk - sq).
    input [b, h, sq, sk] or [b*h, sq, sk]; rows that see no key (sq > sk) are all zeros."""
    return _ops.scaled_softmax_fwd(input, None, scale, "causal_bottom_right")
