"""The operation types of te.ops: every op is an nn.Module called as op(x, *extra_inputs).

num_extra_inputs / num_extra_outputs say how many tensors an op takes besides x (e.g. the
residual AddExtraInput adds) and gives besides its output (MakeExtraOutput's branch); a
Sequential hands them out in order. A FusedOperation runs several basic ops as one, on this
package's fused kernels where there is one (see fused/)."""
from typing import Sequence

import torch


class FusibleOperation(torch.nn.Module):
    num_extra_inputs: int = 0
    num_extra_outputs: int = 0
    is_fused_op: bool = False


class BasicOperation(FusibleOperation):
    """One operation (a linear map, a norm, an activation, ...)."""


class FusedOperation(FusibleOperation):
    """Several adjacent basic ops computed together; `basic_ops` are the ops it stands for (their
    parameters stay theirs)."""
    is_fused_op = True

    def __init__(self, basic_ops: Sequence[BasicOperation]):
        super().__init__()
        self._basic_ops = list(basic_ops)  # not submodules: the Sequential owns them

    @property
    def basic_ops(self) -> list:
        return list(self._basic_ops)

    @property
    def num_extra_inputs(self) -> int:
        return sum(op.num_extra_inputs for op in self._basic_ops)

    @property
    def num_extra_outputs(self) -> int:
        return sum(op.num_extra_outputs for op in self._basic_ops)
