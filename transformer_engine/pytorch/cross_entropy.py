"""TE's cross-entropy entry point, transformer_engine.pytorch.cross_entropy.parallel_cross_entropy."""
from typing import Optional

import torch
from torch import Tensor

from .kernels.cross_entropy import cross_entropy
from .kernels.sharded_cross_entropy import sharded_cross_entropy

__all__ = ["parallel_cross_entropy"]


def parallel_cross_entropy(inp: Tensor, target: Tensor, label_smoothing: float = 0.0, reduce_loss: bool = False,
                           dist_process_group: Optional["torch.distributed.ProcessGroup"] = None,
                           ignore_idx: int = -100, is_cg_capturable: bool = False) -> Tensor:
    """Cross-entropy of inp [SQ, B, V] or [B, SQ, V] against target [SQ, B] or [B, SQ].

    Returns the float32 per-token loss with target's shape (0 at ignore_idx), or with
    reduce_loss=True its mean over the non-ignored tokens. With a dist_process_group of more
    than one rank, inp holds this rank's slice of the vocabulary (rank r the classes
    [r V, (r + 1) V)) and target the global classes: each rank's per-row partials (max, sum of
    exponentials, sum, target logit) are all-reduced, every rank gets the whole loss and its
    slice of the gradient. is_cg_capturable (CUDA graphs) changes nothing here.
    """
    if inp.dim() != 3 or target.shape != inp.shape[:2]:
        raise ValueError(f"parallel_cross_entropy: inp must be [SQ, B, V] or [B, SQ, V] and target its first two "
                         f"dims, got inp {tuple(inp.shape)} and target {tuple(target.shape)}")
    if (dist_process_group is None or not torch.distributed.is_available()
            or torch.distributed.get_world_size(dist_process_group) == 1):
        return cross_entropy(inp, target, label_smoothing, ignore_idx, "mean" if reduce_loss else "none")
    tokens = target.numel()
    loss = sharded_cross_entropy(inp.reshape(tokens, inp.shape[-1]), target.reshape(tokens), label_smoothing,
                                 ignore_idx, dist_process_group).view(target.shape)
    if not reduce_loss:
        return loss
    kept = (target != ignore_idx).sum()
    # As cross_entropy's mean: NaN with every token ignored, with a zero gradient.
    return loss.sum() / kept.clamp(min=1) + torch.where(kept == 0, float("nan"), 0.0)
