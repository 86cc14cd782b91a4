"""Collectives that autograd sees, for tensors that cross a parallel region outside a GEMM
(te.ops' communication ops, context-parallel attention, a returned gathered norm output). Each
is the identity on one rank; all move dim 0."""
import torch
from torch import Tensor

from .collectives import all_gather, all_reduce, all_to_all, group_rank, group_size, reduce_scatter, wait


class _SumOverRanks(torch.autograd.Function):
    """The ranks' sum; the result feeds computations repeated on every rank, so the gradient
    passes back unchanged (TE's AllReduce op)."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        return wait(all_reduce(x, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _Gather(torch.autograd.Function):
    """[n, ...] on each rank -> [size n, ...] in rank order, read by computations that differ
    per rank: a shard's gradient is the ranks' sum of its rows (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return wait(all_gather(x, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return wait(reduce_scatter(grad, ctx.group)), None


class _ReduceScatter(torch.autograd.Function):
    """[size n, ...] -> rank r's rows [n, ...] of the ranks' sum; the gradient is all-gathered."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return wait(reduce_scatter(x, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return wait(all_gather(grad, ctx.group)), None


class _AllToAll(torch.autograd.Function):
    """[size n, ...]: part j goes to rank j, part i of the result came from rank i. The
    exchange is its own adjoint: part i's gradient goes back to rank i by the same exchange."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return wait(all_to_all(x, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return wait(all_to_all(grad, ctx.group)), None


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


def _applied(function, x: Tensor, group) -> Tensor:
    return x if group_size(group) == 1 else function.apply(x, group)


def sum_over_ranks(x: Tensor, group) -> Tensor:
    return _applied(_SumOverRanks, x, group)


def gather(x: Tensor, group) -> Tensor:
    return _applied(_Gather, x, group)


def reduce_scattered(x: Tensor, group) -> Tensor:
    return _applied(_ReduceScatter, x, group)


def exchanged(x: Tensor, group) -> Tensor:
    return _applied(_AllToAll, x, group)


def gather_replicated(shard: Tensor, group) -> Tensor:
    """The ranks' shards along the first dimension, gathered (see _GatherReplicated)."""
    return _applied(_GatherReplicated, shard, group)
