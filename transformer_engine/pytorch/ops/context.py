"""OperationContext: what one basic operation keeps from its forward for its backward, in TE's
op protocol (op_forward / op_backward, fuser_forward / fuser_backward).

A forward writes tensors with save_for_backward and any other state as attributes; the
pipeline hands the same tensors back as saved_tensors in the backward (saved through the
pipeline's autograd node, so autograd's in-place checks apply to them)."""
from typing import Any, Optional, Tuple

import torch


class OperationContext:
    def __init__(self, requires_grad: bool = True) -> None:
        self.requires_grad = requires_grad  # whether a backward will run
        self.to_save: Optional[Tuple[Optional[torch.Tensor], ...]] = None
        self.saved_tensors: Optional[Tuple[Optional[torch.Tensor], ...]] = None

    def save_for_backward(self, *tensors: Optional[torch.Tensor]) -> None:
        self.to_save = tensors

    def __repr__(self) -> str:
        state = {k: v for k, v in vars(self).items() if not isinstance(v, torch.Tensor)}
        return f"OperationContext({state})"

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes never set: name the missing one, as a forward that
        # forgot to save it would want to know.
        raise AttributeError(f"OperationContext has no attribute {name!r}: the op's forward did not set it")
