"""TE's cross-entropy entry point, transformer_engine.pytorch.cross_entropy.parallel_cross_entropy."""
from typing import Optional

import torch
from torch import Tensor

from ._extension import NAMESPACE
from .custom_ops.cross_entropy import all_exactly_one, mean_over_kept
from .custom_ops.sharded_cross_entropy import sharded_cross_entropy

__all__ = ["parallel_cross_entropy"]
_ops = getattr(torch.ops, NAMESPACE)


class _CrossEntropySavingGradient(torch.autograd.Function):
    """TE's autograd for parallel_cross_entropy: the forward computes each token's loss and, in
    fp32, d loss / d logits in the same pass over the logits (with reduce_loss, the mean over the
    kept tokens and its gradient, times 1 / kept), and saves only that gradient; the backward
    scales its rows by the loss's gradient in fp32 and rounds once to the logits' dtype (so a
    per-token loss scale reaches a bf16 gradient with one rounding). The backward is one pass
    over the saved gradient; the price is fp32 memory for it."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, label_smoothing: float, ignore_idx: int,
                reduce_loss: bool) -> Tensor:
        # logits [N, V], target [N]; bf16 / fp16 logits are widened to fp32 first, so that the
        # kernel writes an fp32 gradient (fp32 and fp64 logits give one of their own dtype).
        wide = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        kept = (target != ignore_idx).sum() if reduce_loss else None
        grad_scale = 1 / kept.clamp(min=1).to(wide.dtype) if reduce_loss else None
        loss, grad = _ops.cross_entropy_fwd(wide, target, label_smoothing, ignore_idx, ctx.needs_input_grad[0],
                                            grad_scale)
        ctx.logits_dtype, ctx.rows = logits.dtype, logits.shape[0]
        ctx.save_for_backward(grad)  # [N, V] ([0, V] without a backward)
        return mean_over_kept(loss, kept) if reduce_loss else loss  # [] or [N] fp32 (fp64 for fp64 logits)

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        (grad,) = ctx.saved_tensors
        factor = grad_loss.to(grad.dtype).expand(ctx.rows).contiguous()  # [N]: one per token
        # A mean's forward already applied 1 / kept: loss.backward() of it has nothing to scale.
        scaled = grad if all_exactly_one(factor) else _ops.cross_entropy_bwd(grad, factor)
        return scaled.to(ctx.logits_dtype), None, None, None, None


def parallel_cross_entropy(inp: Tensor, target: Tensor, label_smoothing: float = 0.0, reduce_loss: bool = False,
                           dist_process_group: Optional["torch.distributed.ProcessGroup"] = None,
                           ignore_idx: int = -100, is_cg_capturable: bool = False) -> Tensor:
    """Cross-entropy of inp [SQ, B, V] or [B, SQ, V] against target [SQ, B] or [B, SQ].

    Returns the float32 per-token loss with target's shape (0 at ignore_idx), or with
    reduce_loss=True its mean over the non-ignored tokens. With a dist_process_group of more
    than one rank, inp holds this rank's slice of the vocabulary (rank r the classes
    [r V, (r + 1) V)) and target the global classes: each rank's per-row partials (max, sum of
    exponentials, sum, target logit) are all-reduced, every rank gets the whole loss and its
    slice of the gradient. On one rank the forward saves the fp32 gradient, as TE does
    (_CrossEntropySavingGradient). is_cg_capturable (CUDA graphs) changes nothing here.
    """
    if inp.dim() != 3 or target.shape != inp.shape[:2]:
        raise ValueError(f"parallel_cross_entropy: inp must be [SQ, B, V] or [B, SQ, V] and target its first two "
                         f"dims, got inp {tuple(inp.shape)} and target {tuple(target.shape)}")
    tokens = target.numel()
    logits, target_1d = inp.reshape(tokens, inp.shape[-1]), target.reshape(tokens)  # [N, V], [N]
    if (dist_process_group is None or not torch.distributed.is_available()
            or torch.distributed.get_world_size(dist_process_group) == 1):
        loss = _CrossEntropySavingGradient.apply(logits, target_1d, label_smoothing, ignore_idx, reduce_loss)
        return loss if reduce_loss else loss.view(target.shape)
    loss = sharded_cross_entropy(logits, target_1d, label_smoothing, ignore_idx, dist_process_group).view(target.shape)
    return mean_over_kept(loss, (target != ignore_idx).sum()) if reduce_loss else loss
