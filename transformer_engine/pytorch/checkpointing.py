"""te.checkpoint's body (TE's import path is transformer_engine.pytorch.distributed.checkpoint):
activation recompute that keeps FP8 training exact.

A checkpointed function runs its forward without keeping activations and runs it again during
backward to rebuild them. Under FP8 the replay must compute what the original computed, and
leave the FP8 state as if it had run once:
  * it runs inside the autocast regions that were open at the original forward (the backward
    usually runs outside every autocast);
  * it casts with the scales the original forward used, although the delayed-scaling update
    after the forward has changed them since;
  * it records no amax and schedules no forward update (its amaxes and current scales are
    written into a copy of the state that is thrown away afterwards);
  * the RNG (CPU, accelerator and, when given, a tensor-parallel RNG tracker) is put back, so
    dropout draws the same masks.
The recompute itself is torch.utils.checkpoint's, in either of its modes.

The FP8 side of the replay is fp8/replay.py's, shared with activation_recompute_forward
(activation_recompute.py), which callers that recompute by themselves use (Megatron-Core);
CudaRNGStatesTracker (rng.py) is the RNG tracker both take. It sits below module/, which
recomputes with it (LayerNormMLP's checkpoint argument); distributed.py, TE's import path for
all three, sits above.
"""
import warnings
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from .fp8.context import open_regions
from .fp8.replay import noting_first_uses, replaying


def _alias_of_leaf(value):
    """An alias of an output that is a leaf requiring grad (te.Linear(return_bias=True) returns
    its bias parameter itself). torch's reentrant checkpoint gives the original forward's
    outputs its own backward as history: given to the parameter itself, the recompute's
    backward would reach the same checkpoint again, forever. The alias carries the history."""
    if isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad:
        return value.view_as(value)
    return value


class _Fp8Replay:
    """The first call of run() is the original forward; every later call is a replay of it,
    with the FP8 scales and RNG tracker states the original started from."""

    def __init__(self, function: Callable, kwarg_names: tuple, get_rng_state_tracker: Optional[Callable]):
        self.function = function
        self.kwarg_names = kwarg_names  # the last len(kwarg_names) positional values are these kwargs
        self.tracker = get_rng_state_tracker() if get_rng_state_tracker is not None else None
        self.regions = open_regions()
        self.original_scales: Dict[int, dict] = {}  # id(meta) -> forward scales before the first use
        self.tracker_states = None
        self.ran = False

    def _keep(self, meta, scales: dict) -> None:
        self.original_scales[id(meta)] = scales

    def _call(self, values: tuple):
        count = len(values) - len(self.kwarg_names)
        return self.function(*values[:count], **dict(zip(self.kwarg_names, values[count:])))

    def run(self, *values):
        if not self.ran:
            self.ran = True
            if self.tracker is not None:
                self.tracker_states = dict(self.tracker.get_states())
            with noting_first_uses(self._keep):
                outputs = self._call(values)
            return tuple(map(_alias_of_leaf, outputs)) if isinstance(outputs, tuple) else _alias_of_leaf(outputs)
        return self._replay(values)

    def _replay(self, values: tuple):
        tracker_live = dict(self.tracker.get_states()) if self.tracker is not None else None
        if self.tracker is not None:
            self.tracker.set_states(dict(self.tracker_states))
        try:
            with replaying(self.regions, lambda meta: self.original_scales.get(id(meta))):
                return self._call(values)
        finally:
            if self.tracker is not None:
                self.tracker.set_states(tracker_live)


def _legacy_positional(args: tuple):
    """TransformerEngine 1.x took checkpoint(function, distribute_saved_activations,
    get_rng_state_tracker, tp_group, *args): recognise that form by its types."""
    if len(args) <= 3 or not isinstance(args[0], bool):
        return None
    tracker, group = args[1], args[2]
    if not (tracker is None or callable(tracker)):
        return None
    if not (group is None or (dist.is_available() and isinstance(group, dist.ProcessGroup))):
        return None
    return args[:3], args[3:]


def _group_size(group: Optional[object]) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def checkpoint(function: Callable, *args: Any, distribute_saved_activations: bool = False,
               get_rng_state_tracker: Optional[Callable] = None, tp_group: Optional[object] = None,
               use_reentrant: bool = True, **kwargs: Any):
    """Runs function(*args, **kwargs) without keeping its activations; backward recomputes them.

    Args:
        function: any callable (a module, a closure) returning a tensor or a tuple of values.
        args, kwargs: its arguments; tensors and other values alike. With use_reentrant=True
            (torch's reentrant mode) gradients flow only to parameters when at least one tensor
            argument requires grad, as in torch.utils.checkpoint.
        distribute_saved_activations: TransformerEngine splits the saved inputs over tp_group;
            with a group of one rank there is nothing to split, more ranks are not implemented.
        get_rng_state_tracker: None, or a callable returning a tensor-parallel RNG tracker with
            get_states() / set_states(states) (Megatron's CudaRNGStatesTracker); its states are
            restored for the recompute as the CPU and accelerator RNGs are.
        tp_group: the tensor-parallel group (only for distribute_saved_activations).
        use_reentrant: torch.utils.checkpoint's mode (True: TransformerEngine's default).
    Returns what function returns. Inside te.autocast the recompute in backward reuses the
    recipe, regions and scales of the original forward and records no amax a second time, so
    gradients and the FP8 state after the step equal those of the same step without
    checkpointing. Without autograd (torch.no_grad()) function is simply called.
    """
    legacy = _legacy_positional(args)
    if legacy is not None:
        warnings.warn("checkpoint(function, distribute_saved_activations, get_rng_state_tracker, tp_group, *args) "
                      "is deprecated; pass those three as keyword arguments", DeprecationWarning, stacklevel=2)
        (distribute_saved_activations, get_rng_state_tracker, tp_group), args = legacy
    if not callable(function):
        raise ValueError(f"checkpoint: function must be callable, got {type(function).__name__}")
    if get_rng_state_tracker is not None and not callable(get_rng_state_tracker):
        raise ValueError("checkpoint: get_rng_state_tracker must be None or a callable returning the tracker, "
                         f"got {type(get_rng_state_tracker).__name__}")
    if distribute_saved_activations and _group_size(tp_group) > 1:
        raise NotImplementedError(f"checkpoint: distribute_saved_activations over a tensor-parallel group of "
                                  f"{_group_size(tp_group)} ranks is not implemented")
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    replay = _Fp8Replay(function, tuple(kwargs), get_rng_state_tracker)
    # kwargs travel as trailing positional values: the reentrant mode takes no kwargs, and
    # tensors among them must reach autograd as inputs.
    return torch.utils.checkpoint.checkpoint(replay.run, *args, *kwargs.values(), use_reentrant=bool(use_reentrant),
                                             preserve_rng_state=True)
