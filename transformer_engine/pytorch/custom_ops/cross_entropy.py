"""Fused cross-entropy as dispatcher ops: loss and gradient in one pass over the logits.

The ops (schemas in bindings/cross_entropy_ops.cpp):
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

The argument checks below are bindings/cross_entropy_ops.cpp's, in Python: run by the fake
kernels and before the Triton kernels or the reference on accelerators. The compiled op also
refuses a target outside [0, vocab) that is not ignore_index, which takes reading the target's
values: done here only where they are on the host (no device sync, no trace). On a GPU the
Triton kernel gives such a row a NaN loss and gradient instead.
"""
import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .. import reference
from .._extension import NAMESPACE
from ..reference.norm import stats_dtype
from . import _checks
from ._checks import fail, shape_text
from ._registry import no_double_backward, serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
REDUCTIONS = ("mean", "sum", "none")


# --- argument checks (bindings/cross_entropy_ops.cpp's) ------------------------------------
def _target_values(op: str, target: Tensor, vocab: int, ignore_index: int) -> None:
    # Fake and functional tensors (torch.compile's traces) are Tensor subclasses without values.
    if target.device.type != "cpu" or type(target) is not Tensor:
        return
    bad = ((target != ignore_index) & ((target < 0) | (target >= vocab))).nonzero()
    if len(bad):
        index = int(bad[0, 0])
        fail(op, f"target[{index}] = {int(target[index])} is out of range for {vocab} classes "
                 f"(valid: 0..{vocab - 1}, or ignore_index = {ignore_index})")


def _check_cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale=None):
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


def _check_cross_entropy_bwd(grad, grad_loss):
    op = "cross_entropy_bwd"
    _checks.kernel_dtype(op, "grad", grad)
    if grad.dim() != 2:
        fail(op, f"grad must be [tokens, vocab], got shape {shape_text(grad.shape)}")
    _checks.same_device(op, "grad_loss", grad_loss, "grad", grad)
    _checks.dtype(op, "grad_loss", grad_loss, stats_dtype(grad.dtype))
    _checks.shape(op, "grad_loss", grad_loss, (grad.shape[0],), "one loss gradient per row of grad")


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_fwd")
def _cross_entropy_fwd_fake(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale=None):
    _check_cross_entropy_fwd(logits, target, label_smoothing, ignore_index, compute_grad, grad_scale)
    rows, vocab = logits.shape
    loss = logits.new_empty((rows,), dtype=stats_dtype(logits.dtype))
    grad = logits.new_empty((rows, vocab) if compute_grad else (0, vocab))
    return loss, grad


@torch.library.register_fake(f"{NAMESPACE}::cross_entropy_bwd")
def _cross_entropy_bwd_fake(grad, grad_loss):
    _check_cross_entropy_bwd(grad, grad_loss)
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
torch.library.register_autograd(f"{NAMESPACE}::cross_entropy_bwd", no_double_backward("cross_entropy_bwd"))
serve_on_accelerators("cross_entropy_fwd", reference.cross_entropy_fwd, triton_module="cross_entropy",
                      check=_check_cross_entropy_fwd)
serve_on_accelerators("cross_entropy_bwd", reference.cross_entropy_bwd, triton_module="cross_entropy",
                      check=_check_cross_entropy_bwd)


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
