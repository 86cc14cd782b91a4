"""The operation types of te.ops: every op is an nn.Module called as op(x, *extra_inputs).

num_extra_inputs / num_extra_outputs say how many tensors an op takes besides x (e.g. the
residual AddExtraInput adds) and gives besides its output (MakeExtraOutput's branch); a
Sequential hands them out in order, or routes them between ops through named channels
(set_extra_output_channel / set_extra_input_channel, channels.py).

Two kinds of basic op:
- this package's ops define `forward`, an autograd composition of its kernels; Sequential
  runs adjacent ones fused onto its fused kernels (fused/);
- ops written in TE's op protocol define op_forward(ctx, input_, ...) and
  op_backward(ctx, grad_output) (or fuser_forward / fuser_backward, for extra tensors);
  calling one runs it through OperationFuser, and a pipeline holding one runs by the protocol
  (pipeline.py), where this package's ops take part through their recorded graphs
  (recorded.py) or, for a context a user's fusion wrote, their backward_from_context.
A FusedOperation stands for several adjacent basic ops: this package's (fused/) define
`forward`; a user's defines fuser_forward and/or fuser_backward and is made by a fusion
function (fusion_registry.py)."""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from .channels import ChannelBindings
from .context import OperationContext
from .recorded import is_recorded, record_forward, recorded_backward


def _forward_through_pipeline(self, input: Tensor, *extra_inputs: Tensor, **kwargs):
    """A TE-protocol op called on its own: a pipeline of this op alone (it locks the op's
    channel bindings, as TE's transient fuser does)."""
    from .fuser import OperationFuser
    if self.is_fused_op:
        return OperationFuser([self])(input, *extra_inputs, **kwargs)
    return OperationFuser([self])(input, *extra_inputs, basic_op_kwargs=[kwargs])


def _mark_protocol(cls) -> None:
    """A class whose forward is nn.Module's placeholder follows TE's op protocol: its calls go
    through a pipeline."""
    cls.follows_te_protocol = cls.forward in (torch.nn.Module.forward, _forward_through_pipeline)
    if cls.follows_te_protocol:
        cls.forward = _forward_through_pipeline


class FusibleOperation(torch.nn.Module):
    num_extra_inputs: int = 0
    num_extra_outputs: int = 0
    is_fused_op: bool = False
    follows_te_protocol: bool = False

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, prev_op_grad_output_quantizer=None,
                      next_op_input_quantizer=None, basic_op_kwargs):
        """(output, [extra outputs of each basic op]) for the basic ops this op covers."""
        raise NotImplementedError(f"{type(self).__name__} has no forward in TE's op protocol (fuser_forward)")

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        """(grad input, [param grads of each basic op], [extra input grads of each basic op])."""
        raise NotImplementedError(f"{type(self).__name__} has no backward in TE's op protocol (fuser_backward)")


class BasicOperation(FusibleOperation):
    """One operation (a linear map, a norm, an activation, ...)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        _mark_protocol(cls)

    @property
    def channel_bindings(self) -> ChannelBindings:
        """This op's extra-tensor channels (made on first use: our ops' constructors come from
        other module classes and do not all run this class's)."""
        bindings = self.__dict__.get("_channel_bindings")
        if bindings is None:
            bindings = ChannelBindings.unbound(self.num_extra_inputs, self.num_extra_outputs)
            self.__dict__["_channel_bindings"] = bindings
        return bindings

    def set_extra_input_channel(self, index: int, channel: Optional[str]) -> "BasicOperation":
        """Extra input `index` reads the channel of that name from an earlier op of the pipeline
        (None: from the caller again)."""
        self.channel_bindings.bind_input(type(self).__name__, index, channel)
        return self

    def set_extra_output_channel(self, index: int, channel: Optional[str], *,
                                 output_to_caller: bool = True) -> "BasicOperation":
        """Extra output `index` feeds the channel of that name; output_to_caller=False keeps it
        inside the pipeline (None: a plain public output again)."""
        self.channel_bindings.bind_output(type(self).__name__, index, channel, output_to_caller)
        return self

    @property
    def _extra_tensor_channels_locked(self) -> bool:  # TE's attribute
        return self.channel_bindings.locked

    def _lock_extra_tensor_channels(self) -> None:
        self.channel_bindings.locked = True

    def op_forward(self, ctx: OperationContext, input_: Tensor, *, prev_op_grad_output_quantizer=None,
                   next_op_input_quantizer=None, **kwargs) -> Tensor:
        if self.follows_te_protocol:
            raise NotImplementedError(f"{type(self).__name__} defines neither forward nor op_forward")
        return record_forward(self, ctx, input_, (), kwargs)[0]

    def op_backward(self, ctx: OperationContext, grad_output: Tensor):
        """(grad input, param grads) of a TE-protocol op."""
        if self.follows_te_protocol:
            raise NotImplementedError(f"{type(self).__name__} defines neither forward nor op_backward")
        grad_input, param_grads, _ = self.fuser_backward([ctx], grad_output, basic_op_grad_extra_outputs=[()])
        return grad_input, param_grads[0]

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, prev_op_grad_output_quantizer=None,
                      next_op_input_quantizer=None, basic_op_kwargs):
        if not self.follows_te_protocol:
            return record_forward(self, basic_op_ctxs[0], input_, basic_op_extra_inputs[0], basic_op_kwargs[0])
        self._refuse_extra_tensors("fuser_forward", "op_forward")
        output = self.op_forward(basic_op_ctxs[0], input_, prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
                                 next_op_input_quantizer=next_op_input_quantizer, **basic_op_kwargs[0])
        return output, [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        if not self.follows_te_protocol:
            if is_recorded(ctx):
                return recorded_backward(self, ctx, grad_output, basic_op_grad_extra_outputs[0])
            grad_input, param_grads, extra_grads = self.backward_from_context(ctx, grad_output,
                                                                              basic_op_grad_extra_outputs[0])
            return grad_input, [param_grads], [extra_grads]
        self._refuse_extra_tensors("fuser_backward", "op_backward")
        grad_input, param_grads = self.op_backward(ctx, grad_output)
        return grad_input, [tuple(param_grads)], [()]

    def _refuse_extra_tensors(self, fuser_method: str, op_method: str) -> None:
        if self.num_extra_inputs or self.num_extra_outputs:
            raise RuntimeError(f"{type(self).__name__} has {self.num_extra_inputs} extra inputs and "
                               f"{self.num_extra_outputs} extra outputs: it must define {fuser_method}, not "
                               f"{op_method}")

    # This package's ops in a TE-protocol pipeline.

    def describe_context(self, ctx: OperationContext, input_: Tensor) -> None:
        """Writes into ctx, after this op's recorded forward, what TE's op of the same name
        keeps there for a user's backward fusion to read (see Linear, the activations)."""

    def backward_from_context(self, ctx: OperationContext, grad_output: Tensor,
                              grad_extra_outputs: Sequence[Optional[Tensor]]) -> Tuple[Optional[Tensor], tuple, tuple]:
        """(grad input, param grads, extra input grads) from a context a user's forward fusion
        wrote (as TE's op of the same name keeps it) instead of this op's recorded forward."""
        raise NotImplementedError(f"{type(self).__name__}: its backward needs the context its own forward records; "
                                  f"a forward fusion over it must be a joint forward-backward fusion")


class FusedOperation(FusibleOperation):
    """Several adjacent basic ops computed together; `basic_ops` are the ops it stands for (their
    parameters stay theirs)."""
    is_fused_op = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        _mark_protocol(cls)

    def __init__(self, basic_ops: Sequence[BasicOperation]):
        super().__init__()
        self._basic_ops = list(basic_ops)  # not submodules: the Sequential owns them
        if not self._basic_ops:
            raise ValueError(f"{type(self).__name__}: a fused operation needs at least one basic operation")

    @property
    def basic_ops(self) -> list:
        return list(self._basic_ops)

    @property
    def num_extra_inputs(self) -> int:
        return sum(op.num_extra_inputs for op in self._basic_ops)

    @property
    def num_extra_outputs(self) -> int:
        return sum(op.num_extra_outputs for op in self._basic_ops)
