"""te.ops.Sequential: a container of operations that runs adjacent ones fused.

    model = te.ops.Sequential(te.ops.LayerNorm(h), te.ops.Linear(h, 4 * h), te.ops.GELU(), te.ops.Linear(2 * h, h))
    y = model(x)                                  # LayerNorm+Linear fused, GELU+Linear fused
    y, branch = te.ops.Sequential(te.ops.MakeExtraOutput(), ...)(x)
    y = te.ops.Sequential(..., te.ops.AddExtraInput())(x, residual)

forward(input, *extra_inputs, op_kwargs=None): extra inputs go, in order, to the ops that take
them (num_extra_inputs); the ops' extra outputs come back after the output. op_kwargs maps an
op to keywords for its call (an op given keywords is not fused). Plain nn.Modules may sit
between operations; they break fusion there.

Fusion is decided once per arrangement of the modules (cached; with user fusion functions
registered, also per set of them and recipe kind): each run of adjacent operations
is an OperationGroup (TE's _module_groups), fused by a greedy left-to-right match of the patterns
in FUSIONS, longest first, extra tensors routed by the ops' channels; or, where the group holds
an op in TE's op protocol or a user fusion changes it, run by that protocol (pipeline.py,
docs/te_ops.md).
"""
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..module._recompute_replay import replays_fp8_forward
from .basic.activation import Activation
from .basic.linear import Bias, Linear
from .basic.norm import LayerNorm, RMSNorm
from .basic.tensor_ops import AddExtraInput, ConstantScale, MakeExtraOutput
from .fused import (BackwardActivationBias, BackwardAddRMSNorm, BackwardLinearAdd, BackwardLinearScale,
                    ForwardActivationLinear, ForwardLinearBiasActivation, ForwardLinearBiasAdd, ForwardLinearScaleAdd,
                    ForwardNormLinear)
from .channels import route
from .fusion_registry import fusion_key, user_fusions
from .op import FusibleOperation
from .pipeline import Plan
from .pipeline import run as run_pipeline


def _is(*types) -> Callable[[torch.nn.Module], bool]:
    return lambda op: isinstance(op, types)


def _no_bias_linear(op) -> bool:
    return isinstance(op, Linear) and not op.use_bias and len(op.parameter_names) == 1


def _norm_over_last_dim(op) -> bool:
    return isinstance(op, (LayerNorm, RMSNorm)) and len(op.normalized_shape) == 1


# (fused class, the predicates of its ops), longest patterns of a family first.
FUSIONS: Tuple[Tuple[type, Tuple[Callable, ...]], ...] = (
    (ForwardNormLinear, (_norm_over_last_dim, _is(Linear), _is(Bias))),
    (ForwardNormLinear, (_norm_over_last_dim, _is(Linear))),
    (ForwardLinearBiasAdd, (_no_bias_linear, _is(Bias), _is(AddExtraInput))),
    (ForwardLinearScaleAdd, (_no_bias_linear, _is(ConstantScale), _is(AddExtraInput))),
    (ForwardLinearBiasAdd, (_is(Linear), _is(AddExtraInput))),
    (ForwardLinearBiasActivation, (_no_bias_linear, _is(Bias), _is(Activation))),
    (ForwardLinearBiasActivation, (_no_bias_linear, _is(Bias))),
    (BackwardActivationBias, (_is(Bias), _is(Activation))),
    (ForwardActivationLinear, (_is(Activation), _is(Linear))),
    (BackwardLinearAdd, (_is(MakeExtraOutput), _is(Linear))),
    (BackwardLinearScale, (_no_bias_linear, _is(ConstantScale))),
    (BackwardAddRMSNorm, (_is(MakeExtraOutput), _is(RMSNorm))),
    # A Linear on its own: the same GEMM, under TE's name for a GEMM with its bias (and no
    # activation) in the epilogue.
    (ForwardLinearBiasActivation, (_is(Linear),)),
)


def fuse(ops: Sequence[torch.nn.Module], unfusable: frozenset = frozenset()) -> List[Tuple[torch.nn.Module, list]]:
    """(unit, indices into ops) for each run of adjacent ops: a fused op where the run matches a
    pattern, else the op alone; ops in `unfusable` (by id) stay alone."""
    units, i = [], 0
    while i < len(ops):
        for fused_class, predicates in FUSIONS:
            window = list(ops[i:i + len(predicates)])
            if (len(window) == len(predicates) and all(p(op) for p, op in zip(predicates, window))
                    and not any(id(op) in unfusable for op in window)):
                units.append((fused_class(window), list(range(i, i + len(window)))))
                i += len(window)
                break
        else:
            units.append((ops[i], [i]))
            i += 1
    return units


class OperationGroup:
    """A run of adjacent te.ops operations in a Sequential (other modules stand alone), with
    how they run: _forward_ops and _backward_ops list (unit, indices of the basic ops it
    covers).

    Most groups run natively: fused by FUSIONS onto this package's kernels, each unit one
    autograd node serving both directions (the two lists are the same), extra tensors routed
    between units by the ops' channels (`routing`: autograd adds up the gradients of a tensor
    that several units read). A group that user fusion functions change or that holds an op
    written in TE's op protocol runs by that protocol instead (`plan`, pipeline.py): one unit
    per remaining basic op, the user's fused ops where their functions put them, forward and
    backward fused apart. Building a group locks its ops' channel bindings."""

    def __init__(self, basic_ops: List[torch.nn.Module], unfusable: frozenset):
        self._basic_ops = basic_ops
        expansions = [op.basic_ops if op.is_fused_op else [op] for op in basic_ops]
        expanded = [b for ops in expansions for b in ops]
        self.routing = route(expanded)
        user_units = user_fusions(expanded)
        self.plan: Optional[Plan] = None
        if user_units is None and not any(op.follows_te_protocol for op in basic_ops):
            self._forward_ops = fuse(basic_ops, unfusable)
            self._backward_ops = self._forward_ops
            # Each run op's indices among the expanded basic ops, which the routing counts in.
            starts = [sum(map(len, expansions[:i])) for i in range(len(expansions))]
            expanded_of = [list(range(start, start + len(ops))) for start, ops in zip(starts, expansions)]
            self._unit_plans = self._plan_units(expanded, expanded_of)
        else:
            one_each = [(op, [i]) for i, op in enumerate(expanded)]
            self._forward_ops, self._backward_ops = user_units or (one_each, one_each)
            self.plan = Plan(tuple(expanded), self.routing, self._forward_ops, self._backward_ops)
        self._expanded = expanded
        for op in expanded:
            op._lock_extra_tensor_channels()

    def _plan_units(self, expanded: list, expanded_of: List[List[int]]) -> list:
        """(unit, where each of its extra inputs comes from, the slots its extra outputs fill) for
        each native unit, worked out once: a source is (True, index among the caller's extra
        inputs) or (False, the producing slot)."""
        routing = self.routing
        caller_index = {slot: i for i, slot in enumerate(routing.external_inputs)}
        plans = []
        for unit, covered in self._forward_ops:
            ops = [e for i in covered for e in expanded_of[i]]
            sources = [(True, caller_index[(e, s)]) if source is None else (False, source)
                       for e in ops for s, source in enumerate(routing.sources[e])]
            outputs = [(e, s) for e in ops for s in range(expanded[e].num_extra_outputs)]
            plans.append((unit, sources, outputs))
        return plans

    def run(self, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor],
            op_kwargs: Dict[torch.nn.Module, dict]) -> Tuple[torch.Tensor, list]:
        """(output, public extra outputs) of the group on x and its public extra inputs."""
        if self.plan is not None:
            x, *public = run_pipeline(self.plan, x, extra_inputs, [op_kwargs.get(op, {}) for op in self._expanded])
            return x, public
        produced: Dict[tuple, torch.Tensor] = {}
        for unit, sources, outputs in self._unit_plans:
            args = [extra_inputs[key] if from_caller else produced[key] for from_caller, key in sources]
            out = unit(x, *args, **op_kwargs[unit]) if unit in op_kwargs else unit(x, *args)
            if not outputs:
                x = out
                continue
            x, *extra = out
            produced.update(zip(outputs, extra))
        return x, [produced[slot] for slot in self.routing.public_outputs]


class Sequential(torch.nn.Module):
    def __init__(self, *args) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for module in args:
                self.append(module)
        self._groups_cache: Dict[tuple, List[object]] = {}
        self._last_unfusable: frozenset = frozenset()

    def append(self, module: torch.nn.Module) -> "Sequential":
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"Sequential: expected an nn.Module (a te.ops operation or any module), got "
                            f"{type(module).__name__}")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "Sequential":
        for module in modules:
            self.append(module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*modules[index])
        return modules[index]

    def __setitem__(self, index: int, module: torch.nn.Module) -> None:
        key = list(self._modules)[index]
        self._modules[key] = module

    def __delitem__(self, index) -> None:
        modules = list(self._modules.values())
        del modules[index]
        self._modules.clear()
        self.extend(modules)

    def insert(self, index: int, module: torch.nn.Module) -> "Sequential":
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        return self.extend(modules)

    def __add__(self, other: "Sequential") -> "Sequential":
        return Sequential(*self, *other)

    def __iadd__(self, other: "Sequential") -> "Sequential":
        return self.extend(list(other))

    def pop(self, index: int = -1) -> torch.nn.Module:
        module = self[index]
        del self[index]
        return module

    def _groups(self, unfusable: frozenset) -> List[object]:
        """OperationGroups of adjacent operations, and the other modules between them."""
        ops = []
        for module in self._modules.values():  # nested Sequentials contribute their ops
            ops.extend(module._modules.values() if isinstance(module, Sequential) else [module])
        key = (tuple(id(op) for op in ops), unfusable, fusion_key())
        if key not in self._groups_cache:
            groups, run = [], []
            for op in ops + [None]:
                if isinstance(op, FusibleOperation):
                    run.append(op)
                    continue
                if run:
                    groups.append(OperationGroup(run, unfusable))
                    run = []
                if op is not None:
                    groups.append(op)
            self._groups_cache = {key: groups}
        return self._groups_cache[key]

    @property
    def _module_groups(self) -> List[object]:
        """The groups of the last forward (TE's name)."""
        return self._groups(self._last_unfusable)

    @replays_fp8_forward
    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor,
                op_kwargs: Optional[Dict[torch.nn.Module, dict]] = None):
        op_kwargs = op_kwargs or {}
        remaining = list(extra_inputs)
        extra_outputs = []
        x = input
        self._last_unfusable = frozenset(id(op) for op in op_kwargs)
        for group in self._groups(self._last_unfusable):
            if not isinstance(group, OperationGroup):  # a plain module between operations
                x = group(x)
                continue
            args, remaining = self._take(group, len(group.routing.external_inputs), remaining, extra_inputs)
            x, more = group.run(x, args, op_kwargs)
            extra_outputs.extend(more)
        if remaining:
            raise ValueError(f"Sequential: {len(remaining)} of the {len(extra_inputs)} extra inputs were not used")
        return (x, *extra_outputs) if extra_outputs else x

    @staticmethod
    def _take(group: OperationGroup, takes: int, remaining: list, given: tuple) -> Tuple[list, list]:
        """The next `takes` extra inputs for group, and those left."""
        if takes > len(remaining):
            names = ", ".join(type(op).__name__ for op in group._expanded)
            raise ValueError(f"Sequential: the operations {names} take {takes} extra input(s), "
                             f"{len(remaining)} left of the {len(given)} given")
        return remaining[:takes], remaining[takes:]
