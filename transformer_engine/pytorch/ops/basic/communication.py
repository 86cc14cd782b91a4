"""te.ops.AllReduce, AllGather and ReduceScatter over a process group (default: the world),
differentiable as TE's are: all-gather's backward is a reduce-scatter and the other way round;
all-reduce's output feeds computations repeated on every rank, so its backward is the identity
(TE's reduce_in_backward argument is accepted and, as there, changes nothing). Gather and
scatter work on dim 0; an FP8 (quantized) input is exchanged as its values. With one rank, or
without torch.distributed initialised, each is the identity."""
from typing import Optional

import torch
from torch import Tensor

from ...fp8.quantized_tensor import QuantizedTensor
from ...parallel.collectives import all_gather, all_reduce, group_size, reduce_scatter, wait
from ..op import BasicOperation


def _values(x: Tensor) -> Tensor:
    return x.dequantize() if isinstance(x, QuantizedTensor) else x


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        return wait(all_reduce(_values(x), group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return wait(all_gather(_values(x), group))  # [n, ...] -> [size * n, ...]

    @staticmethod
    def backward(ctx, grad: Tensor):
        return wait(reduce_scatter(grad, ctx.group)), None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        size = group_size(group)
        if x.shape[0] % size:
            raise ValueError(f"ReduceScatter: dim 0 ({x.shape[0]}) is not divisible by the group size {size}")
        return wait(reduce_scatter(_values(x), group))  # [size * n, ...] -> [n, ...]

    @staticmethod
    def backward(ctx, grad: Tensor):
        return wait(all_gather(grad, ctx.group)), None


class _Collective(BasicOperation):
    function = None

    def __init__(self, process_group: Optional[object] = None) -> None:
        super().__init__()
        self.process_group = process_group

    def forward(self, x: Tensor) -> Tensor:
        return x if group_size(self.process_group) == 1 else self.function.apply(x, self.process_group)


class AllReduce(_Collective):
    function = _AllReduce

    def __init__(self, process_group: Optional[object] = None, reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self.reduce_in_backward = reduce_in_backward


class AllGather(_Collective):
    function = _AllGather


class ReduceScatter(_Collective):
    function = _ReduceScatter
