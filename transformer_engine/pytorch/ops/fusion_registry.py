"""Fusions a user registers for te.ops pipelines: TE's register_forward_backward_fusion,
register_forward_fusion and register_backward_fusion.

A fusion function takes the pipeline's list of ops and the recipe (`func(ops, recipe=...)`)
and returns the list with runs of basic ops replaced by FusedOperations. Joint fusions apply
first; the forward and backward passes then each apply their own functions to the result, so
the two directions may be fused differently. `prepend` puts a function first in its pass.

This package's own fusions (sequential.FUSIONS, onto its fused kernels) are not in these
lists: a pipeline that user fusions change, or that holds an op written in TE's op protocol,
runs each remaining basic op on its own (see pipeline.py)."""
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ..fp8.global_state import FP8GlobalStateManager

FusionFunction = Callable[..., list]
Units = List[Tuple[torch.nn.Module, List[int]]]  # (op or fused op, indices of the basic ops it covers)

_JOINT: List[FusionFunction] = []
_FORWARD: List[FusionFunction] = []
_BACKWARD: List[FusionFunction] = []


def _register(functions: List[FusionFunction], op_fusion_func: FusionFunction, prepend: bool) -> None:
    if not callable(op_fusion_func):
        raise TypeError(f"a fusion function must be callable, got {type(op_fusion_func).__name__}")
    functions.insert(0 if prepend else len(functions), op_fusion_func)


def register_forward_backward_fusion(op_fusion_func: FusionFunction, prepend: bool = False) -> None:
    """A fusion whose fused op implements both fuser_forward and fuser_backward: only the pair
    need match the basic ops' forward and backward."""
    _register(_JOINT, op_fusion_func, prepend)


def register_forward_fusion(op_fusion_func: FusionFunction, prepend: bool = False) -> None:
    """A forward-only fusion: its fuser_forward must leave in each basic op's context what that
    op's own backward reads."""
    _register(_FORWARD, op_fusion_func, prepend)


def register_backward_fusion(op_fusion_func: FusionFunction, prepend: bool = False) -> None:
    """A backward-only fusion: its fuser_backward reads the contexts the basic ops' own forwards
    wrote."""
    _register(_BACKWARD, op_fusion_func, prepend)


def _apply(ops: Sequence, functions: Sequence[FusionFunction], recipe) -> list:
    for func in functions:
        ops = list(func(list(ops), recipe=recipe))
    return list(ops)


def map_to_basic_ops(fused: Sequence, basic_ops: Sequence) -> Units:
    """(op, covered indices) for each op of `fused`, which must expand to exactly `basic_ops`
    in order."""
    units, i = [], 0
    for op in fused:
        covered = list(op.basic_ops) if getattr(op, "is_fused_op", False) else [op]
        for basic in covered:
            if i >= len(basic_ops) or basic is not basic_ops[i]:
                raise RuntimeError(f"a fusion function's ops ({[type(o).__name__ for o in fused]}) do not cover "
                                   f"the pipeline's basic ops ({[type(o).__name__ for o in basic_ops]}) in order")
            i += 1
        units.append((op, list(range(i - len(covered), i))))
    if i != len(basic_ops):
        raise RuntimeError(f"a fusion function's ops ({[type(o).__name__ for o in fused]}) cover {i} of the "
                           f"pipeline's {len(basic_ops)} basic ops")
    return units


def _recipe_in_force():
    """The recipe the fusion functions are given: te.autocast's, None outside one."""
    return FP8GlobalStateManager.get_fp8_recipe() if FP8GlobalStateManager.is_fp8_enabled() else None


def fusion_key() -> Optional[tuple]:
    """What a pipeline's fusion depends on besides its ops: None while no function is registered,
    else the registered functions and the recipe in force (as TE, which fuses again when the
    recipe changes)."""
    if not (_JOINT or _FORWARD or _BACKWARD):
        return None
    return tuple(map(id, _JOINT)), tuple(map(id, _FORWARD)), tuple(map(id, _BACKWARD)), type(_recipe_in_force())


def user_fusions(basic_ops: Sequence) -> Optional[Tuple[Units, Units]]:
    """The forward and backward units the registered functions make of `basic_ops`, or None
    where none is registered or none changed anything."""
    if not (_JOINT or _FORWARD or _BACKWARD):
        return None
    recipe = _recipe_in_force()
    joint = _apply(basic_ops, _JOINT, recipe)
    forward = _apply(joint, _FORWARD, recipe)
    backward = _apply(joint, _BACKWARD, recipe)
    if all(len(ops) == len(basic_ops) and all(a is b for a, b in zip(ops, basic_ops)) for ops in (forward, backward)):
        return None
    return map_to_basic_ops(forward, basic_ops), map_to_basic_ops(backward, basic_ops)
