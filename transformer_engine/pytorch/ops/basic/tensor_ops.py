"""te.ops's parameter-free tensor ops: Identity, Reshape, ConstantScale, Dropout, and the
extra-tensor ops AddExtraInput (y = x + an extra input; AddInPlace is its older name) and
MakeExtraOutput (x also given out as an extra output)."""
from typing import Iterable, Tuple

import torch
from torch import Tensor

from ..op import BasicOperation


class Identity(BasicOperation):
    def forward(self, x: Tensor) -> Tensor:
        return x

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        return grad_output, (), ()


class Reshape(BasicOperation):
    """x.reshape(shape) (one -1 allowed); the gradient is reshaped back."""

    def __init__(self, shape: Iterable[int]) -> None:
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(self.shape)


class ConstantScale(BasicOperation):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = float(scale)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        return grad_output * self.scale, (), ()


class Dropout(BasicOperation):
    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must lie in [0, 1], got {p}")
        self.dropout_probability = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.dropout(x, self.dropout_probability, self.training)


class _AddInto(torch.autograd.Function):
    """extra += x, in place, returning a view of extra; both get the output's gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, extra: Tensor) -> Tensor:
        extra.add_(x)  # autograd does not track the write: extra's own gradient is the output's
        return extra.view_as(extra)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, grad


class AddExtraInput(BasicOperation):
    """y = x + extra (same shape). in_place=True adds into `extra`'s memory and returns a view of
    it (TE's advanced option: the extra input is overwritten; its gradient is still y's)."""
    num_extra_inputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: Tensor, extra: Tensor) -> Tensor:
        if tuple(x.shape) != tuple(extra.shape):
            raise ValueError(f"AddExtraInput: input has shape {tuple(x.shape)}, the extra input "
                             f"{tuple(extra.shape)}")
        if self.in_place:
            return _AddInto.apply(x.to(extra.dtype), extra)
        return x + extra

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        return grad_output, (), (grad_output,)


AddInPlace = AddExtraInput


class MakeExtraOutput(BasicOperation):
    """(x, x): the input continues and is also given out; both gradients add up in x's."""
    num_extra_outputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        return x, x

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        (grad_branch,) = grad_extra_outputs
        return grad_output if grad_branch is None else grad_output + grad_branch, (), ()
