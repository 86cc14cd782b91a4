"""te.ops.AllReduce, AllGather and ReduceScatter over a process group (default: the world),
differentiable as TE's are (parallel/autograd.py): all-gather's backward is a reduce-scatter and
the other way round; all-reduce's output feeds computations repeated on every rank, so its
backward is the identity (TE's reduce_in_backward argument is accepted and, as there, changes
nothing). Gather and scatter work on dim 0; an FP8 (quantized) input is exchanged as its
values. With one rank, or without torch.distributed initialised, each is the identity."""
from typing import Optional

from torch import Tensor

from ...fp8.quantized_tensor import QuantizedTensor
from ...parallel.autograd import gather, reduce_scattered, sum_over_ranks
from ...parallel.collectives import group_size
from ..op import BasicOperation


class _Collective(BasicOperation):
    exchange = None  # (x, group) -> tensor, differentiable

    def __init__(self, process_group: Optional[object] = None) -> None:
        super().__init__()
        self.process_group = process_group

    def forward(self, x: Tensor) -> Tensor:
        if group_size(self.process_group) == 1:
            return x
        values = x.dequantize() if isinstance(x, QuantizedTensor) else x
        return type(self).exchange(values, self.process_group)


class AllReduce(_Collective):
    exchange = staticmethod(sum_over_ranks)

    def __init__(self, process_group: Optional[object] = None, reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self.reduce_in_backward = reduce_in_backward


class AllGather(_Collective):
    exchange = staticmethod(gather)


class ReduceScatter(_Collective):
    exchange = staticmethod(reduce_scattered)
