"""te.ops.Sequential: a container of operations that runs adjacent ones fused.

    model = te.ops.Sequential(te.ops.LayerNorm(h), te.ops.Linear(h, 4 * h), te.ops.GELU(), te.ops.Linear(2 * h, h))
    y = model(x)                                  # LayerNorm+Linear fused, GELU+Linear fused
    y, branch = te.ops.Sequential(te.ops.MakeExtraOutput(), ...)(x)
    y = te.ops.Sequential(..., te.ops.AddExtraInput())(x, residual)

forward(input, *extra_inputs, op_kwargs=None): extra inputs go, in order, to the ops that take
them (num_extra_inputs); the ops' extra outputs come back after the output. op_kwargs maps an
op to keywords for its call (an op given keywords is not fused). Plain nn.Modules may sit
between operations; they break fusion there.

Fusion is decided once per arrangement of the modules (cached): a greedy left-to-right match
of the patterns in FUSIONS, longest first.
"""
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .basic.activation import Activation
from .basic.linear import Bias, Linear
from .basic.norm import LayerNorm, RMSNorm
from .basic.tensor_ops import AddExtraInput, ConstantScale, MakeExtraOutput
from .fused import (BackwardActivationBias, BackwardAddRMSNorm, BackwardLinearAdd, BackwardLinearScale,
                    ForwardActivationLinear, ForwardLinearBiasActivation, ForwardLinearBiasAdd, ForwardLinearScaleAdd,
                    ForwardNormLinear)
from .op import FusibleOperation


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
    (ForwardLinearBiasAdd, (_no_bias_linear, _is(AddExtraInput))),
    (ForwardLinearBiasActivation, (_no_bias_linear, _is(Bias), _is(Activation))),
    (ForwardLinearBiasActivation, (_no_bias_linear, _is(Bias))),
    (BackwardActivationBias, (_is(Bias), _is(Activation))),
    (ForwardActivationLinear, (_is(Activation), _is(Linear))),
    (BackwardLinearAdd, (_is(MakeExtraOutput), _is(Linear))),
    (BackwardLinearScale, (_is(ConstantScale), _is(Linear))),
    (BackwardAddRMSNorm, (_is(MakeExtraOutput), _is(RMSNorm))),
)


def fuse(ops: Sequence[torch.nn.Module], unfusable: frozenset = frozenset()) -> List[torch.nn.Module]:
    """ops with each run of adjacent ops that matches a pattern replaced by its fused op;
    ops in `unfusable` (by id) stay alone."""
    units, i = [], 0
    while i < len(ops):
        for fused_class, predicates in FUSIONS:
            window = list(ops[i:i + len(predicates)])
            if (len(window) == len(predicates) and all(p(op) for p, op in zip(predicates, window))
                    and not any(id(op) in unfusable for op in window)):
                units.append(fused_class(window))
                i += len(window)
                break
        else:
            units.append(ops[i])
            i += 1
    return units


class Sequential(torch.nn.Module):
    def __init__(self, *args) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for module in args:
                self.append(module)
        self._units_cache: Dict[tuple, List[torch.nn.Module]] = {}

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

    def _units(self, unfusable: frozenset) -> List[torch.nn.Module]:
        ops = []
        for module in self._modules.values():  # nested Sequentials contribute their ops
            ops.extend(module._modules.values() if isinstance(module, Sequential) else [module])
        key = (tuple(id(op) for op in ops), unfusable)
        if key not in self._units_cache:
            self._units_cache = {key: fuse(ops, unfusable)}
        return self._units_cache[key]

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor,
                op_kwargs: Optional[Dict[torch.nn.Module, dict]] = None):
        op_kwargs = op_kwargs or {}
        remaining = list(extra_inputs)
        extra_outputs = []
        x = input
        for unit in self._units(frozenset(id(op) for op in op_kwargs)):
            takes = unit.num_extra_inputs if isinstance(unit, FusibleOperation) else 0
            if takes > len(remaining):
                raise ValueError(f"Sequential: {type(unit).__name__} takes {takes} extra input(s), "
                                 f"{len(remaining)} left of the {len(extra_inputs)} given")
            args, remaining = remaining[:takes], remaining[takes:]
            out = unit(x, *args, **op_kwargs.get(unit, {}))
            if isinstance(unit, FusibleOperation) and unit.num_extra_outputs:
                x, *more = out
                extra_outputs.extend(more)
            else:
                x = out
        if remaining:
            raise ValueError(f"Sequential: {len(remaining)} of the {len(extra_inputs)} extra inputs were not used")
        return (x, *extra_outputs) if extra_outputs else x
