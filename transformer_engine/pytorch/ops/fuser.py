"""te.ops.fuser.OperationFuser: TransformerEngine's runner of a pipeline of operations, at TE's
module path. It runs the basic operations of `ops` (a fused operation or a Sequential gives its
own) as te.ops.Sequential runs them, fused by the same patterns:

    fuser = OperationFuser([te.ops.Linear(h, h), te.ops.Bias(h), te.ops.AddExtraInput()])
    y = fuser(x, residual)                   # num_extra_inputs extra inputs, in the ops' order
    y = fuser(x, residual, basic_op_kwargs=[{}, {}, {}])   # keywords per basic op (unfused)

TE main's named extra-tensor channels between operations (set_extra_output_channel /
set_extra_input_channel) are not here: every extra input comes from the caller and every
extra output goes back to it.
"""
from typing import Any, Dict, List, Optional, Sequence

import torch

from .op import FusibleOperation
from .sequential import Sequential


class OperationFuser:
    def __init__(self, ops: Sequence[torch.nn.Module]) -> None:
        self._basic_ops: List[torch.nn.Module] = []
        for op in ops:
            inner = getattr(op, "basic_ops", None)
            if isinstance(op, Sequential):
                self._basic_ops.extend(op._modules.values())
            elif inner is not None:
                self._basic_ops.extend(inner)
            elif isinstance(op, FusibleOperation):
                self._basic_ops.append(op)
            else:
                raise TypeError(f"OperationFuser: ops must be te.ops operations, got {type(op).__name__}")
        self.num_extra_inputs = sum(op.num_extra_inputs for op in self._basic_ops)
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
