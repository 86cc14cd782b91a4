"""This package's own basic ops inside a TE-protocol pipeline.

Our ops are autograd compositions of custom ops (their `forward`), not op_forward /
op_backward pairs. In a pipeline that runs TE's protocol (pipeline.py) such an op runs its own
forward on detached copies of its inputs with autograd on, and keeps that graph in its
context; its backward differentiates the graph (torch.autograd.grad) for the input, the extra
inputs and the op's parameters. The gradients are those of the op called alone."""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .context import OperationContext


@dataclass
class RecordedGraph:
    leaves: List[Optional[Tensor]]  # input, then extra inputs, as the graph saw them
    outputs: List[Tensor]           # output, then extra outputs


def _leaf(t: Optional[Tensor]) -> Optional[Tensor]:
    if t is None or not t.is_floating_point():
        return t
    return t.detach().requires_grad_(True)


def record_forward(op, ctx: OperationContext, x: Tensor, extra_inputs: Sequence[Optional[Tensor]],
                   kwargs: dict) -> Tuple[Tensor, List[tuple]]:
    """op's forward on x and its extra inputs -> (output, [extra outputs]), fuser_forward's
    return; with ctx.requires_grad the graph is kept in ctx (ctx.recorded)."""
    if not ctx.requires_grad:
        with torch.no_grad():
            out = op(x, *extra_inputs, **kwargs)
        y, *extras = out if op.num_extra_outputs else (out,)
        return y, [tuple(extras)]
    with torch.enable_grad():
        leaves = [_leaf(t) for t in (x, *extra_inputs)]
        out = op(*leaves, **kwargs)
    outputs = list(out) if op.num_extra_outputs else [out]
    ctx.recorded = RecordedGraph(leaves, outputs)
    op.describe_context(ctx, x)
    y, *extras = [o.detach() for o in outputs]
    return y, [tuple(extras)]


def is_recorded(ctx: OperationContext) -> bool:
    return "recorded" in vars(ctx)


def recorded_backward(op, ctx: OperationContext, grad_output: Tensor,
                      grad_extra_outputs: Sequence[Optional[Tensor]]) -> Tuple[Optional[Tensor], list, list]:
    """fuser_backward's return (grad input, [param grads], [extra input grads]) from the graph
    record_forward kept; extra outputs whose gradient is None contribute nothing."""
    graph: RecordedGraph = ctx.recorded
    pairs = [(o, g) for o, g in zip(graph.outputs, (grad_output, *grad_extra_outputs))
             if g is not None and o.requires_grad]
    params = list(op.parameters())
    wrt = [t for t in graph.leaves if t is not None and t.requires_grad] + [p for p in params if p.requires_grad]
    grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                 if pairs and wrt else [None] * len(wrt))
    leaf_grads = [next(grads) if t is not None and t.requires_grad else None for t in graph.leaves]
    param_grads = tuple(next(grads) if p.requires_grad else None for p in params)
    return leaf_grads[0], [param_grads], [tuple(leaf_grads[1:])]
