"""Argument checks of the cross-entropy ops (bindings/cross_entropy_ops.cpp's, in Python): run
by their fake kernels and before the Triton kernels or the reference on accelerators: one
function per op, taking the op's arguments.

The compiled op also refuses a target outside [0, vocab) that is not ignore_index, which takes
reading the target's values: done here only where they are on the host (no device sync, no
trace). On a GPU the Triton kernel gives such a row a NaN loss and gradient instead."""
import torch
from torch import Tensor

from ..reference.norm import stats_dtype
from . import _checks
from ._checks import fail, shape_text


def _target_values(op: str, target: Tensor, vocab: int, ignore_index: int) -> None:
    # Fake and functional tensors (torch.compile's traces) are Tensor subclasses without values.
    if target.device.type != "cpu" or type(target) is not Tensor:
        return
    bad = ((target != ignore_index) & ((target < 0) | (target >= vocab))).nonzero()
    if len(bad):
        index = int(bad[0, 0])
        fail(op, f"target[{index}] = {int(target[index])} is out of range for {vocab} classes "
                 f"(valid: 0..{vocab - 1}, or ignore_index = {ignore_index})")


def cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale=None):
    op = "cross_entropy_fwd"
    _checks.kernel_dtype(op, "logits", logits)
    if logits.dim() != 2:
        fail(op, f"logits must be [tokens, vocab], got shape {shape_text(logits.shape)}")
    rows, vocab = logits.shape
    if vocab == 0:
        fail(op, f"logits must have at least one class, got shape {shape_text(logits.shape)}")
    _checks.same_device(op, "target", target, "logits", logits)
    _checks.dtype(op, "target", target, torch.long)
    _checks.shape(op, "target", target, (rows,), "one class index per row of logits")
    if not 0.0 <= label_smoothing <= 1.0:
        fail(op, f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if grad_scale is not None:
        _checks.same_device(op, "grad_scale", grad_scale, "logits", logits)
        _checks.dtype(op, "grad_scale", grad_scale, stats_dtype(logits.dtype))
        if grad_scale.dim() != 0:
            _checks.shape(op, "grad_scale", grad_scale, (rows,), "one factor per row, or [] for all")
    _target_values(op, target, vocab, ignore_index)


def cross_entropy_bwd(grad, grad_loss):
    op = "cross_entropy_bwd"
    _checks.kernel_dtype(op, "grad", grad)
    if grad.dim() != 2:
        fail(op, f"grad must be [tokens, vocab], got shape {shape_text(grad.shape)}")
    _checks.same_device(op, "grad_loss", grad_loss, "grad", grad)
    _checks.dtype(op, "grad_loss", grad_loss, stats_dtype(grad.dtype))
    _checks.shape(op, "grad_loss", grad_loss, (grad.shape[0],), "one loss gradient per row of grad")
