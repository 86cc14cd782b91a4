"""Fused cross-entropy as dispatcher ops: loss and gradient in one pass over the logits.

The ops (schemas in bindings/schemas.cpp):
    cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad) -> (loss, grad)
    cross_entropy_bwd(grad, grad_loss) -> grad_logits
logits [N, V]; target [N] int64; loss [N] float32 (float64 for float64 logits); grad [N, V]
in logits' dtype, d loss[n] / d logits[n], written by the forward when compute_grad (the
backward then only scales its rows, so the logits are read once). Semantics:
reference/cross_entropy.py.
"""
import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ..reference.norm import stats_dtype
from ._registry import serve_reference_where_no_kernel
from .norm import _check_same_device, _no_double_backward

_ops = getattr(torch.ops, NAMESPACE)
REDUCTIONS = ("mean", "sum", "none")


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_fwd")
def _cross_entropy_fwd_fake(logits, target, label_smoothing, ignore_index, compute_grad):
    _check_same_device("cross_entropy_fwd", logits, target=target)
    rows, vocab = logits.shape
    loss = logits.new_empty((rows,), dtype=stats_dtype(logits.dtype))
    grad = logits.new_empty((rows, vocab) if compute_grad else (0, vocab))
    return loss, grad


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_bwd")
def _cross_entropy_bwd_fake(grad, grad_loss):
    _check_same_device("cross_entropy_bwd", grad, grad_loss=grad_loss)
    return grad.new_empty(grad.shape)


def _setup_context(ctx, inputs, output):
    _logits, _target, _label_smoothing, _ignore_index, compute_grad = inputs
    _loss, grad = output
    ctx.compute_grad = compute_grad
    ctx.save_for_backward(grad)
    ctx.mark_non_differentiable(grad)
    # Otherwise autograd hands the backward a zero-filled [N, V] "gradient" for `grad`
    # (which nothing differentiates): a write as large as the logits, for nothing.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, _grad_grad):
    if grad_loss is None:  # the loss reached the backward without a gradient
        return None, None, None, None, None
    if not ctx.compute_grad:
        raise RuntimeError("cross_entropy_fwd: called with compute_grad=False, so no gradient was saved; "
                           "pass compute_grad=True when logits need a gradient")
    (grad,) = ctx.saved_tensors
    return _ops.cross_entropy_bwd(grad, grad_loss), None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::cross_entropy_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::cross_entropy_bwd", _no_double_backward("cross_entropy_bwd"))
for _name in ("cross_entropy_fwd", "cross_entropy_bwd"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name))


def cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float = 0.0, ignore_index: int = -100,
                  reduction: str = "mean") -> Tensor:
    """torch.nn.functional.cross_entropy for logits [..., V] (classes LAST) and target [...].

    The loss is float32 (float64 for float64 logits) whatever the logits' dtype. reduction
    'none' gives target's shape (0 at ignored tokens); 'sum' the total; 'mean' the total over
    the number of non-ignored tokens, NaN when there is none, with a zero gradient (as torch).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if logits.dim() < 1 or logits.shape[:-1] != target.shape:
        raise ValueError(f"cross_entropy: logits {tuple(logits.shape)} must be target's shape "
                         f"{tuple(target.shape)} plus a class dimension")
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError(f"cross_entropy: logits must have at least one class, got shape {list(logits.shape)}")
    compute_grad = logits.requires_grad and torch.is_grad_enabled()
    tokens = target.numel()
    loss, _ = _ops.cross_entropy_fwd(logits.reshape(tokens, vocab), target.reshape(tokens), label_smoothing,
                                     ignore_index, compute_grad)
    if reduction == "none":
        return loss.view(target.shape)
    if reduction == "sum":
        return loss.sum()
    kept = (target != ignore_index).sum()
    # As torch: with every token ignored the mean is NaN (0 / 0) but the gradient is 0.
    return loss.sum() / kept.clamp(min=1) + torch.where(kept == 0, float("nan"), 0.0)
