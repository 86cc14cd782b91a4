"""TE's cross-entropy entry point, transformer_engine.pytorch.cross_entropy.parallel_cross_entropy."""
from typing import Optional

import torch
from torch import Tensor

from .ops.cross_entropy import cross_entropy

__all__ = ["parallel_cross_entropy"]


def parallel_cross_entropy(inp: Tensor, target: Tensor, label_smoothing: float = 0.0, reduce_loss: bool = False,
                           dist_process_group: Optional["torch.distributed.ProcessGroup"] = None,
                           ignore_idx: int = -100, is_cg_capturable: bool = False) -> Tensor:
    """Cross-entropy of inp [SQ, B, V] or [B, SQ, V] against target [SQ, B] or [B, SQ].

    Returns the float32 per-token loss with target's shape (0 at ignore_idx), or with
    reduce_loss=True its mean over the non-ignored tokens. is_cg_capturable (CUDA graphs)
    changes nothing here. A dist_process_group of more than one rank (vocabulary sharded
    across ranks) is not supported yet; the kernel's per-row partials (max, sum of exp,
    sum, target logit) are what such a version would all-reduce.
    """
    if (dist_process_group is not None and torch.distributed.is_available()
            and torch.distributed.get_world_size(dist_process_group) > 1):
        raise NotImplementedError("parallel_cross_entropy: a vocabulary split over a process group of "
                                  f"{torch.distributed.get_world_size(dist_process_group)} ranks is not supported yet; "
                                  "gather the logits or pass dist_process_group=None")
    if inp.dim() != 3 or target.shape != inp.shape[:2]:
        raise ValueError(f"parallel_cross_entropy: inp must be [SQ, B, V] or [B, SQ, V] and target its first two "
                         f"dims, got inp {tuple(inp.shape)} and target {tuple(target.shape)}")
    return cross_entropy(inp, target, label_smoothing, ignore_idx, "mean" if reduce_loss else "none")
