"""Fused attention softmax (TE's ScaledSoftmax family) as dispatcher ops.

The ops (schemas in bindings/softmax_ops.cpp):
    scaled_softmax_fwd(input, mask?, scale, mask_type) -> output
    scaled_softmax_bwd(grad_output, output, mask?, scale, mask_type) -> grad_input
input [b, h, sq, sk] (or [b*h, sq, sk] without a padding mask); math in float32, output in
input's dtype; the backward needs only the forward's output. Semantics: reference/softmax.py.

The argument checks below are bindings/softmax_ops.cpp's, in Python: run by the fake kernels
and before the Triton kernels or the reference on accelerators.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ..reference.softmax import MASK_TYPES
from . import _checks
from ._checks import fail, shape_text
from ._registry import no_double_backward, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)


# --- argument checks (bindings/softmax_ops.cpp's) ------------------------------------------
def _scores(op: str, arg: str, scores: Tensor, mask: Optional[Tensor], mask_type: str) -> None:
    """scores (the forward's input, the backward's output) [b, h, sq, sk] or [b*h, sq, sk], and
    the mask mask_type asks for: bool [b|1, h|1, sq|1, sk] for 'padding', none otherwise."""
    if mask_type not in MASK_TYPES:
        fail(op, f"mask_type must be 'none', 'padding', 'causal' or 'causal_bottom_right', got '{mask_type}'")
    _checks.kernel_dtype(op, arg, scores)
    if scores.dim() not in (3, 4):
        fail(op, f"{arg} must be [batch, heads, sq, sk] or [batch * heads, sq, sk], got shape "
                 f"{shape_text(scores.shape)}")
    sq, sk = scores.shape[-2:]
    if mask_type == "causal" and sq != sk:
        fail(op, f"the upper-triangular (causal) mask needs square scores (sq == sk), input has shape "
                 f"{shape_text(scores.shape)}; use the bottom-right aligned causal mask for sq != sk")
    if mask_type != "padding":
        if mask is not None:
            fail(op, f"mask_type '{mask_type}' takes no mask tensor, got one of shape {shape_text(mask.shape)}")
        return
    if mask is None:
        fail(op, "mask_type 'padding' needs a mask tensor (bool, True = masked out)")
    _checks.same_device(op, "mask", mask, arg, scores)
    _checks.dtype(op, "mask", mask, torch.bool)
    if scores.dim() != 4:
        fail(op, f"a masked softmax needs 4-D input [batch, heads, sq, sk], got shape {shape_text(scores.shape)}")
    fits = mask.dim() == 4 and mask.shape[3] == sk and all(
        mask.shape[d] in (1, scores.shape[d]) for d in range(3))
    if not fits:
        fail(op, f"mask has shape {shape_text(mask.shape)} which does not broadcast to input's "
                 f"{shape_text(scores.shape)} as [batch or 1, heads or 1, sq or 1, sk]")


def _check_scaled_softmax_fwd(input, mask, scale, mask_type):
    _scores("scaled_softmax_fwd", "input", input, mask, mask_type)


def _check_scaled_softmax_bwd(grad_output, output, mask, scale, mask_type):
    op = "scaled_softmax_bwd"
    _scores(op, "output", output, mask, mask_type)
    _checks.same_device(op, "grad_output", grad_output, "output", output)
    _checks.dtype(op, "grad_output", grad_output, output.dtype)
    _checks.shape(op, "grad_output", grad_output, output.shape, "it must match output")


@torch.library.register_fake(f"{NAMESPACE}::scaled_softmax_fwd")
def _scaled_softmax_fwd_fake(input, mask, scale, mask_type):
    _check_scaled_softmax_fwd(input, mask, scale, mask_type)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::scaled_softmax_bwd")
def _scaled_softmax_bwd_fake(grad_output, output, mask, scale, mask_type):
    _check_scaled_softmax_bwd(grad_output, output, mask, scale, mask_type)
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
torch.library.register_autograd(f"{NAMESPACE}::scaled_softmax_bwd", no_double_backward("scaled_softmax_bwd"))
serve_on_accelerators("scaled_softmax_fwd", reference.scaled_softmax_fwd, triton_module="softmax",
                      check=_check_scaled_softmax_fwd)
serve_on_accelerators("scaled_softmax_bwd", reference.scaled_softmax_bwd, triton_module="softmax",
                      check=_check_scaled_softmax_bwd)


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
