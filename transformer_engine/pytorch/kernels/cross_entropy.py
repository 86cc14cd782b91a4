"""Fused cross-entropy as dispatcher ops: loss and gradient in one pass over the logits.

The ops (schemas in bindings/schemas.cpp):
    cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale=None)
        -> (loss, grad)
    cross_entropy_bwd(grad, grad_loss) -> grad_logits
logits [N, V]; target [N] int64; loss [N] float32 (float64 for float64 logits); grad [N, V]
in logits' dtype, grad_scale * d loss[n] / d logits[n] (grad_scale [] or [N]), written by the
forward when compute_grad, so the logits are read once. The backward scales grad's rows by
grad_loss / grad_scale, and skips that pass when every factor is exactly 1: a mean passes
grad_scale = 1 / kept tokens, which is what autograd hands back for it, so a training step's
backward costs nothing here (TE's fused cross-entropy skips it the same way).
Without compute_grad the backward runs the forward again on the saved logits with
grad_scale = grad_loss, one factor per row: the gradient of an unreduced loss, whose upstream
gradient the forward cannot know, is then scaled in fp32 and rounded to the logits' dtype
once (a bf16 gradient scaled after its rounding is rounded twice). Semantics:
reference/cross_entropy.py.
"""
import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import reference
from .._extension import NAMESPACE
from ..reference.norm import stats_dtype
from . import _cross_entropy_checks
from ._registry import serve_reference_where_no_kernel
from .norm import _no_double_backward

_ops = getattr(torch.ops, NAMESPACE)
REDUCTIONS = ("mean", "sum", "none")


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_fwd")
def _cross_entropy_fwd_fake(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale=None):
    _cross_entropy_checks.cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale)
    rows, vocab = logits.shape
    loss = logits.new_empty((rows,), dtype=stats_dtype(logits.dtype))
    grad = logits.new_empty((rows, vocab) if compute_grad else (0, vocab))
    return loss, grad


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_bwd")
def _cross_entropy_bwd_fake(grad, grad_loss):
    _cross_entropy_checks.cross_entropy_bwd(grad, grad_loss)
    return grad.new_empty(grad.shape)


def _setup_context(ctx, inputs, output):
    logits, target, label_smoothing, ignore_index, compute_grad, grad_scale = inputs
    _loss, grad = output
    ctx.compute_grad = compute_grad
    ctx.label_smoothing, ctx.ignore_index = label_smoothing, ignore_index
    if compute_grad:
        ctx.save_for_backward(grad, grad_scale)
    else:  # the backward recomputes the gradient, scaled per row
        ctx.save_for_backward(logits, target)
    ctx.mark_non_differentiable(grad)
    # Otherwise autograd hands the backward a zero-filled [N, V] "gradient" for `grad`
    # (which nothing differentiates): a write as large as the logits, for nothing.
    ctx.set_materialize_grads(False)


def all_exactly_one(factor: Tensor) -> bool:
    """True when scaling by factor would change nothing and the saved gradient can be handed
    on as it is. Asked only of plain eager tensors: the check reads data, which a trace
    (torch.compile, make_fx, fake or functionalised tensors, functorch transforms) cannot do,
    and there the multiply by ones gives the same bits. Never when the backward builds a graph
    (create_graph=True: the saved gradient has none)."""
    traced = (torch.compiler.is_compiling() or type(factor) is not Tensor or torch._is_functional_tensor(factor)
              or torch._C._functorch.is_functorch_wrapped_tensor(factor) or _get_current_dispatch_mode() is not None)
    return not traced and not torch.is_grad_enabled() and bool((factor == 1).all())


def _backward(ctx, grad_loss, _grad_grad):
    if grad_loss is None:  # the loss reached the backward without a gradient
        return None, None, None, None, None, None
    if not ctx.compute_grad:
        logits, target = ctx.saved_tensors
        _, grad_logits = _ops.cross_entropy_fwd(logits, target, ctx.label_smoothing, ctx.ignore_index, True,
                                                grad_loss.contiguous())
        return grad_logits, None, None, None, None, None
    grad, grad_scale = ctx.saved_tensors
    factor = grad_loss if grad_scale is None else grad_loss / grad_scale  # [N]
    grad_logits = grad if all_exactly_one(factor) else _ops.cross_entropy_bwd(grad, factor)
    return grad_logits, None, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::cross_entropy_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::cross_entropy_bwd", _no_double_backward("cross_entropy_bwd"))
for _name in ("cross_entropy_fwd", "cross_entropy_bwd"):
    serve_reference_where_no_kernel(_name, getattr(reference, _name), triton_module="cross_entropy",
                                    check=getattr(_cross_entropy_checks, _name))


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
    # Unreduced, the loss's upstream gradient is unknown here: the backward computes the
    # gradient with it (one rounding), from the saved logits, instead of the forward.
    compute_grad = logits.requires_grad and torch.is_grad_enabled() and reduction != "none"
    tokens = target.numel()
    grad_scale = None
    if reduction == "mean":
        kept = (target != ignore_index).sum()
        divisor = kept.clamp(min=1)
        if compute_grad:
            # The mean's factor, computed as autograd computes d(sum / divisor) / d sum, so the
            # backward finds exactly it and has nothing to do.
            grad_scale = 1 / divisor.to(stats_dtype(logits.dtype))
    loss, _ = _ops.cross_entropy_fwd(logits.reshape(tokens, vocab), target.reshape(tokens), label_smoothing,
                                     ignore_index, compute_grad, grad_scale)
    if reduction == "none":
        return loss.view(target.shape)
    if reduction == "sum":
        return loss.sum()
    return mean_over_kept(loss, kept)


def mean_over_kept(loss: Tensor, kept: Tensor) -> Tensor:
    """The per-token loss summed over the kept (non-ignored) count `kept` (an integer 0-d
    tensor). As torch: with every token ignored the mean is NaN (0 / 0) but the gradient is 0."""
    return loss.sum() / kept.clamp(min=1) + torch.where(kept == 0, float("nan"), 0.0)
