"""The replay of a forward that activation recompute runs, and what it replays from: te.checkpoint,
callers that recompute by themselves through activation_recompute_forward, and
torch.utils.checkpoint's recompute of an FP8 module's forward (Hugging Face's gradient
checkpointing, which calls no code of ours before it recomputes).

Under FP8 a replay must compute what the original forward computed and leave the FP8 state as
if the forward had run once. Every cast names the FP8 state (state.Fp8Meta) it is about to read
or change through note_use() (the slot quantizers of tensor/for_recipe.py call it); that one
hook serves both kinds of capture:
- noting_first_uses() (te.checkpoint) keeps, for the states a checkpointed function uses, the
  scales they cast with;
- forward_record() (a module's last FP8 forward, for torch.utils.checkpoint) keeps the regions
  open then and its state's scales.
replaying() runs the replay inside the original regions, each state casting with its kept
scales, and afterwards puts every state back as it found it (amax histories included).

Scales are kept only where a cast reads them: under delayed scaling (the recipe's, or a
CustomRecipe's DelayedScalingRequests). Current scaling and the block recipes derive each
scale from the tensor being cast, so a replay of the same tensors finds the same scales; and
under torch.inference_mode no recompute can follow.
"""
import contextlib
import threading
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch

from .context import Fp8Context, open_regions, recompute_region
from .state import Fp8Meta


class _Listeners(threading.local):
    def __init__(self):
        self.stack: List[Callable[[Fp8Meta], None]] = []


_listeners = _Listeners()


def note_use(meta: Fp8Meta) -> None:
    """Called by a slot's quantizer before it casts with or records into `meta`."""
    for listener in _listeners.stack:
        listener(meta)


@contextlib.contextmanager
def _listening(listener: Callable[[Fp8Meta], None]) -> Iterator[None]:
    _listeners.stack.append(listener)
    try:
        yield
    finally:
        _listeners.stack.pop()


def no_recompute_can_follow() -> bool:
    """Under torch.inference_mode no graph is built, so no recompute can follow. (Dynamo cannot
    trace the query, and a compiled region's recompute is torch.compile's own.)"""
    return not torch.compiler.is_compiling() and torch.is_inference_mode_enabled()


def scales_to_replay(meta: Fp8Meta) -> Optional[dict]:
    """Copies of the forward scales a replay must cast with (None: the casts derive their
    scales from the tensors, or no recompute can follow)."""
    if meta.delayed_scaling is None or no_recompute_can_follow():
        return None
    return meta.forward_state(with_history=False)


@contextlib.contextmanager
def noting_first_uses(keep: Callable[[Fp8Meta, Optional[dict]], None]) -> Iterator[None]:
    """Calls keep(fp8_meta, scales_to_replay(fp8_meta)) once per FP8 state the body uses,
    before the first use changes it."""
    seen = set()

    def note(meta: Fp8Meta) -> None:
        if id(meta) not in seen:
            seen.add(id(meta))
            keep(meta, scales_to_replay(meta))

    with _listening(note):
        yield


class ForwardRecord(NamedTuple):
    """A module's last FP8 forward: its autocast regions (outermost first), its FP8 state
    `meta` and the scales_to_replay it cast with."""
    regions: Tuple[Fp8Context, ...]
    meta: Fp8Meta
    scales: Optional[dict]


def forward_record(meta: Fp8Meta) -> ForwardRecord:
    """The record of a forward about to cast with `meta`, for a torch.utils.checkpoint
    recompute of it."""
    return ForwardRecord(open_regions(), meta, scales_to_replay(meta))


@contextlib.contextmanager
def replaying(regions: tuple, original_scales: Callable[[Fp8Meta], Optional[dict]]) -> Iterator[None]:
    """Runs the body as a replay of a forward: inside `regions` (the autocast regions of the
    original forward), each FP8 state casting with original_scales(meta) (None: the scales it
    has), no forward update scheduled; afterwards every state used is put back as it was
    before the replay, amax histories included, so the replay leaves no trace."""
    live: Dict[int, tuple] = {}

    def note(meta: Fp8Meta) -> None:
        if id(meta) not in live:
            live[id(meta)] = (meta, meta.forward_state())
            original = original_scales(meta)
            if original is not None:
                meta.load_forward_state(original)

    try:
        with _listening(note), recompute_region(regions):
            yield
    finally:  # also when torch stops a non-reentrant recompute early (by raising)
        for meta, state in live.values():
            meta.load_forward_state(state)


def replaying_records(records: List[ForwardRecord]):
    """The replay of the forwards `records` describe (one module tree's last FP8 forwards,
    the first one's regions), or None without records."""
    if not records:
        return None
    scales = {id(record.meta): record.scales for record in records}
    return replaying(records[0].regions, lambda meta: scales.get(id(meta)))
