"""te.ops.AllReduce, AllGather and ReduceScatter over a process group (default: the world),
differentiable (all-gather's backward is a reduce-scatter and the other way round; all-reduce's
backward all-reduces when reduce_in_backward). Gather and scatter work on dim 0. With one rank,
or without torch.distributed initialised, each is the identity."""
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ..op import BasicOperation


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group, reduce_in_backward: bool) -> Tensor:
        ctx.group, ctx.reduce_in_backward = group, reduce_in_backward
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.reduce_in_backward:
            grad = grad.clone()
            dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        out = x.new_empty((x.shape[0] * _world(group),) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out = grad.new_empty((grad.shape[0] // _world(ctx.group),) + tuple(grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        world = _world(group)
        if x.shape[0] % world:
            raise ValueError(f"ReduceScatter: dim 0 ({x.shape[0]}) is not divisible by the group size {world}")
        out = x.new_empty((x.shape[0] // world,) + tuple(x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out = grad.new_empty((grad.shape[0] * _world(ctx.group),) + tuple(grad.shape[1:]))
        dist.all_gather_into_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


class AllReduce(BasicOperation):
    def __init__(self, process_group: Optional[object] = None, reduce_in_backward: bool = True) -> None:
        super().__init__()
        self.process_group, self.reduce_in_backward = process_group, reduce_in_backward

    def forward(self, x: Tensor) -> Tensor:
        if _world(self.process_group) == 1:
            return x
        return _AllReduce.apply(x, self.process_group, self.reduce_in_backward)


class AllGather(BasicOperation):
    def __init__(self, process_group: Optional[object] = None) -> None:
        super().__init__()
        self.process_group = process_group

    def forward(self, x: Tensor) -> Tensor:
        return x if _world(self.process_group) == 1 else _AllGather.apply(x, self.process_group)


class ReduceScatter(BasicOperation):
    def __init__(self, process_group: Optional[object] = None) -> None:
        super().__init__()
        self.process_group = process_group

    def forward(self, x: Tensor) -> Tensor:
        return x if _world(self.process_group) == 1 else _ReduceScatter.apply(x, self.process_group)
