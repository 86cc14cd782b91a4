"""te.ops.fuser.OperationFuser: TransformerEngine's runner of a pipeline of operations, at TE's
module path. It runs the basic operations of `ops` (a fused operation or a Sequential gives its
own) as te.ops.Sequential runs them:

    fuser = OperationFuser([te.ops.Linear(h, h), te.ops.Bias(h), te.ops.AddExtraInput()])
    y = fuser(x, residual)                   # num_extra_inputs extra inputs, in the ops' order
    y = fuser(x, residual, basic_op_kwargs=[{}, {}, {}])   # keywords per basic op (unfused)

Building one routes the ops' extra-tensor channels (a name with two producers, or read with no
earlier producer, is refused here) and locks their bindings; num_extra_inputs counts only the
public extra inputs.
"""
from typing import Any, Dict, List, Optional, Sequence

import torch

from .channels import route
from .fusion_registry import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion
from .op import FusibleOperation
from .sequential import Sequential

# TE's module path for the registration functions too.
__all__ = ["OperationFuser", "register_forward_fusion", "register_backward_fusion",
           "register_forward_backward_fusion"]


class OperationFuser:
    def __init__(self, ops: Sequence[torch.nn.Module]) -> None:
        self._basic_ops: List[torch.nn.Module] = []
        for op in ops:
            if isinstance(op, Sequential):
                self._basic_ops.extend(op._modules.values())
            elif isinstance(op, FusibleOperation):
                self._basic_ops.extend(op.basic_ops if op.is_fused_op else [op])
            else:
                raise TypeError(f"OperationFuser: ops must be te.ops operations, got {type(op).__name__}")
        routing = route(self._basic_ops)
        for op in self._basic_ops:
            op._lock_extra_tensor_channels()
        self._basic_op_extra_input_sources = [list(sources) for sources in routing.sources]  # TE's attribute
        self.num_extra_inputs = len(routing.external_inputs)
        self._sequential = Sequential(*self._basic_ops)

    def __call__(self, input: torch.Tensor, *extra_inputs: torch.Tensor,
                 basic_op_kwargs: Optional[List[Dict[str, Any]]] = None):
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"OperationFuser: expected {self.num_extra_inputs} extra inputs but got "
                             f"{len(extra_inputs)}")
        if basic_op_kwargs is not None and len(basic_op_kwargs) != len(self._basic_ops):
            raise ValueError(f"OperationFuser: basic_op_kwargs has {len(basic_op_kwargs)} entries for "
                             f"{len(self._basic_ops)} basic operations")
        op_kwargs = {op: kwargs for op, kwargs in zip(self._basic_ops, basic_op_kwargs or []) if kwargs}
        return self._sequential(input, *extra_inputs, op_kwargs=op_kwargs)
