"""TransformerEngine's hook for activation recompute that the caller runs by itself
(transformer_engine.pytorch.distributed.activation_recompute_forward; Megatron-Core's
CheckpointWithoutOutput uses it): the same FP8 replay as te.checkpoint (fp8/replay.py), with
the original forward's scales kept per FP8 state between the caller's two calls.
"""
import collections
import contextlib
import threading
import weakref
from typing import Optional

from .fp8.context import current_context, open_regions
from .fp8.replay import noting_first_uses, replaying


class _RecomputeFlags(threading.local):
    def __init__(self):
        self.in_region = False  # inside activation_recompute_forward(activation_recompute=True)
        self.recompute_phase = False


_recompute_flags = _RecomputeFlags()
# Forward scales kept by activation_recompute_forward's first phase, oldest first per FP8 state:
# pipeline schedules run several microbatches' forwards before their backwards, in order.
_scales_for_recompute: "weakref.WeakKeyDictionary[object, collections.deque]" = weakref.WeakKeyDictionary()


class activation_recompute_forward(contextlib.ContextDecorator):
    """TransformerEngine's hook for activation recompute done by the caller (Megatron-Core's
    CheckpointWithoutOutput): the caller runs a forward under
    activation_recompute_forward(activation_recompute=True, recompute_phase=False), later
    replays it under the same autocast recipe with recompute_phase=True.

    The first phase keeps, per FP8 state it uses, the forward scales it casts with; the
    replay casts with those scales (the delayed-scaling update has changed them since),
    records no amax, schedules no update, and leaves every state as it found it, exactly as
    te.checkpoint's own replay. With activation_recompute=False it changes nothing.
    """

    def __init__(self, activation_recompute: bool = False, recompute_phase: bool = False):
        self.activation_recompute = bool(activation_recompute)
        self.recompute_phase = bool(recompute_phase)
        self._body: Optional[contextlib.ExitStack] = None

    @staticmethod
    def _keep(meta, scales: dict) -> None:
        _scales_for_recompute.setdefault(meta, collections.deque()).append(scales)

    @staticmethod
    def _oldest_scales(meta) -> Optional[dict]:
        kept = _scales_for_recompute.get(meta)
        return kept.popleft() if kept else None

    def __enter__(self) -> "activation_recompute_forward":
        body = contextlib.ExitStack()
        if self.activation_recompute and self.recompute_phase:
            body.enter_context(replaying(open_regions(), self._oldest_scales))
        elif self.activation_recompute:
            body.enter_context(noting_first_uses(self._keep))
        outer = (_recompute_flags.in_region, _recompute_flags.recompute_phase)
        body.callback(lambda: setattr(_recompute_flags, "in_region", outer[0]))
        body.callback(lambda: setattr(_recompute_flags, "recompute_phase", outer[1]))
        _recompute_flags.in_region, _recompute_flags.recompute_phase = self.activation_recompute, self.recompute_phase
        self._body = body
        return self

    def __exit__(self, *exc_details) -> None:
        body, self._body = self._body, None
        body.close()


def is_fp8_activation_recompute_enabled() -> bool:
    """Inside activation_recompute_forward(activation_recompute=True) with FP8 enabled."""
    context = current_context()
    return _recompute_flags.in_region and context is not None and context.enabled


def in_fp8_activation_recompute_phase() -> bool:
    """Inside activation_recompute_forward(..., recompute_phase=True)."""
    return _recompute_flags.recompute_phase
