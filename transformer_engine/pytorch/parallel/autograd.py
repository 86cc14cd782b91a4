"""Collectives that autograd sees, for tensors that cross a parallel region outside a GEMM."""
import torch
from torch import Tensor

from .collectives import all_gather, group_rank, group_size, wait


class _GatherReplicated(torch.autograd.Function):
    """Token shards [n, ...] -> the whole [size * n, ...] on every rank, which the ranks then use
    alike (a replicated computation): each shard's gradient is its own rows of the gradient."""

    @staticmethod
    def forward(ctx, shard: Tensor, group) -> Tensor:
        ctx.group, ctx.rows = group, shard.shape[0]
        return wait(all_gather(shard, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        start = group_rank(ctx.group) * ctx.rows
        return grad[start:start + ctx.rows], None


def gather_replicated(shard: Tensor, group) -> Tensor:
    """The ranks' shards along the first dimension, gathered (see _GatherReplicated)."""
    if group_size(group) == 1:
        return shard
    return _GatherReplicated.apply(shard, group)
