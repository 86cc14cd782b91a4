"""Argument checks of the attention-softmax ops (bindings/softmax_ops.cpp's, in Python): run by
their fake kernels and before the Triton kernels or the reference on accelerators: one
function per op, taking the op's arguments."""
from typing import Optional

import torch
from torch import Tensor

from ..reference.softmax import MASK_TYPES
from . import _checks
from ._checks import fail, shape_text


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


def scaled_softmax_fwd(input, mask, scale, mask_type):
    _scores("scaled_softmax_fwd", "input", input, mask, mask_type)


def scaled_softmax_bwd(grad_output, output, mask, scale, mask_type):
    op = "scaled_softmax_bwd"
    _scores(op, "output", output, mask, mask_type)
    _checks.same_device(op, "grad_output", grad_output, "output", output)
    _checks.dtype(op, "grad_output", grad_output, output.dtype)
    _checks.shape(op, "grad_output", grad_output, output.shape, "it must match output")
