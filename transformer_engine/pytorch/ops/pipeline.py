"""A pipeline of basic ops run by TE's op protocol: one autograd node for the whole run, each
basic op's state in an OperationContext, forward and backward each through its own units.

    plan = Plan(basic_ops, routing, forward_units, backward_units)
    y, *public_extra_outputs = run(plan, x, public_extra_inputs, kwargs_per_op)

A unit is a basic op or a FusedOperation over consecutive basic ops; its fuser_forward takes
the contexts of the basic ops it covers and their extra inputs, and returns the output and
their extra outputs; fuser_backward returns the input's gradient, the gradients of each
op's parameters (in `op.parameters()` order) and of each op's extra inputs.

Extra tensors follow the channel routing (channels.py). A bound extra input whose producer
lies in the same unit is left None for the unit (the fusion owns that edge, both ways); a
bound extra output a unit returns as None is refused where it is public or read outside the
unit. The gradient of an extra output is the caller's (for a public one) plus what each
consumer's backward gives its extra input."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .channels import ChannelRouting, Slot
from .context import OperationContext
from .fusion_registry import Units


@dataclass(frozen=True)
class Plan:
    basic_ops: Tuple[torch.nn.Module, ...]
    routing: ChannelRouting
    forward_units: Units
    backward_units: Units

    @property
    def params(self) -> List[List[torch.nn.Parameter]]:
        return [list(op.parameters()) for op in self.basic_ops]


def _add(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    return b if a is None else a if b is None else a + b


def _forward(plan: Plan, contexts: List[OperationContext], x: Tensor, extra_inputs: Sequence[Tensor],
             kwargs: Sequence[dict], requires_grad: bool) -> Tuple[Tensor, List[Tensor]]:
    routing = plan.routing
    inputs = [[None] * len(sources) for sources in routing.sources]
    for tensor, (i, s) in zip(extra_inputs, routing.external_inputs):
        inputs[i][s] = tensor
    produced: Dict[Slot, Tensor] = {}
    for unit, covered in plan.forward_units:
        for i in covered:
            for s, source in enumerate(routing.sources[i]):
                if source is not None and source[0] not in covered:
                    inputs[i][s] = produced[source]
        x, extra_outputs = unit.fuser_forward(
            [contexts[i] for i in covered], x, basic_op_extra_inputs=[tuple(inputs[i]) for i in covered],
            prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
            basic_op_kwargs=[kwargs[i] for i in covered])
        if len(extra_outputs) != len(covered):
            raise RuntimeError(f"{type(unit).__name__}.fuser_forward gave extra outputs for {len(extra_outputs)} "
                               f"ops; it covers {len(covered)}")
        for i, outputs in zip(covered, extra_outputs):
            _keep_extra_outputs(plan, unit, covered, i, outputs, produced, requires_grad)
    public = [produced[slot] for slot in routing.public_outputs]
    return x, public


def _keep_extra_outputs(plan: Plan, unit, covered: List[int], i: int, outputs: Sequence[Optional[Tensor]],
                        produced: Dict[Slot, Tensor], requires_grad: bool) -> None:
    op = plan.basic_ops[i]
    if len(outputs) != op.num_extra_outputs:
        raise RuntimeError(f"{type(unit).__name__}.fuser_forward gave {len(outputs)} extra outputs for op {i} "
                           f"({type(op).__name__}), which has {op.num_extra_outputs}")
    for s, tensor in enumerate(outputs):
        readers = [c for c in plan.routing.consumers.get((i, s), ()) if c not in covered]
        if tensor is None:
            if (i, s) in plan.routing.public_outputs:
                raise RuntimeError(f"{type(unit).__name__}: extra output {s} of op {i} ({type(op).__name__}) is "
                                   f"public, but its fuser_forward gave None for it")
            if readers:
                raise RuntimeError(f"{type(unit).__name__}: extra output {s} of op {i} ({type(op).__name__}) is "
                                   f"read by op {readers[0]}, outside its forward fusion, but its fuser_forward "
                                   f"gave None for it")
            continue
        # A fresh leaf for the readers: marked as needing a gradient when the pipeline does, so
        # a reader can tell whether to compute one.
        produced[(i, s)] = tensor.detach().requires_grad_(requires_grad and tensor.is_floating_point())


def _backward(plan: Plan, contexts: List[OperationContext], grad_output: Tensor,
              grad_public: Sequence[Tensor]) -> Tuple[Tensor, List[Optional[Tensor]], List[List[Optional[Tensor]]]]:
    routing = plan.routing
    slot_grads: Dict[Slot, Optional[Tensor]] = dict(zip(routing.public_outputs, grad_public))
    external_grads: Dict[Slot, Optional[Tensor]] = {}
    param_grads = [[None] * len(params) for params in plan.params]
    dy = grad_output
    for unit, covered in reversed(plan.backward_units):
        grad_extra_outputs = [tuple(slot_grads.get((i, s)) for s in range(plan.basic_ops[i].num_extra_outputs))
                              for i in covered]
        dy, unit_param_grads, unit_input_grads = unit.fuser_backward(
            [contexts[i] for i in covered], dy, basic_op_grad_extra_outputs=grad_extra_outputs)
        for i, grads in zip(covered, unit_param_grads):
            for k, grad in enumerate(grads or ()):
                param_grads[i][k] = _add(param_grads[i][k], grad)
        for i, grads in zip(covered, unit_input_grads):
            for s, grad in enumerate(grads or ()):
                source = routing.sources[i][s]
                if source is None:
                    external_grads[(i, s)] = _add(external_grads.get((i, s)), grad)
                elif source[0] not in covered:  # an edge inside the unit is the fusion's own
                    slot_grads[source] = _add(slot_grads.get(source), grad)
    return dy, [external_grads.get(slot) for slot in routing.external_inputs], param_grads


class _PipelineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: Plan, kwargs: Sequence[dict], num_extra: int, x: Tensor, *flat: Tensor):
        contexts = [OperationContext(requires_grad=True) for _ in plan.basic_ops]
        y, public = _forward(plan, contexts, x, flat[:num_extra], kwargs, True)
        saved, ranges = [], []
        for op_ctx in contexts:
            tensors = op_ctx.to_save or ()
            ranges.append((len(saved), len(saved) + len(tensors)))
            saved.extend(tensors)
            op_ctx.to_save = None
        ctx.save_for_backward(*saved)
        ctx.plan, ctx.contexts, ctx.ranges, ctx.num_extra = plan, contexts, ranges, num_extra
        return (y.detach(), *(t.detach() for t in public))

    @staticmethod
    def backward(ctx, grad_output: Tensor, *grad_public: Tensor):
        saved = ctx.saved_tensors
        for op_ctx, (start, end) in zip(ctx.contexts, ctx.ranges):
            op_ctx.saved_tensors = tuple(saved[start:end])
        dx, extra_grads, param_grads = _backward(ctx.plan, ctx.contexts, grad_output, grad_public)
        flat_param_grads = [grad for grads in param_grads for grad in grads]
        return (None, None, None, dx, *extra_grads, *flat_param_grads)


def run(plan: Plan, x: Tensor, extra_inputs: Sequence[Tensor], kwargs: Sequence[dict]) -> tuple:
    """(output, *public extra outputs) of the pipeline; one autograd node where grad is on."""
    if len(extra_inputs) != len(plan.routing.external_inputs):
        raise ValueError(f"the pipeline takes {len(plan.routing.external_inputs)} extra inputs, got "
                         f"{len(extra_inputs)}")
    if not torch.is_grad_enabled():
        contexts = [OperationContext(requires_grad=False) for _ in plan.basic_ops]
        y, public = _forward(plan, contexts, x, extra_inputs, kwargs, False)
        return (y, *public)
    flat_params = [p for params in plan.params for p in params]
    return _PipelineFunction.apply(plan, list(kwargs), len(extra_inputs), x, *extra_inputs, *flat_params)
