"""The replay of a forward that activation recompute runs: te.checkpoint, callers that
recompute by themselves through activation_recompute_forward, and torch.utils.checkpoint's
recompute of an FP8 module's forward (module/_fp8_module.py's replays_fp8_forward).

Under FP8 the replay must compute what the original forward computed and leave the FP8 state
as if the forward had run once: noting_first_uses() keeps, during the original forward, the
scales each FP8 state (state.Fp8Meta) casts with; replaying() runs the replay with those
scales, inside the original autocast regions, and then puts every state back as it found it
(amax histories included). Both hear of each state through context.fp8_state_recorder, which
every read or write of a state notes first.
"""
import contextlib
from typing import Callable, Dict, Iterator, Optional

from .context import fp8_state_recorder, recompute_region


@contextlib.contextmanager
def noting_first_uses(keep: Callable[[object, dict], None]) -> Iterator[None]:
    """Calls keep(fp8_meta, its forward scale/scale_inv) once per FP8 state the body uses,
    before the first use changes them: the scales a later replay must cast with."""
    seen = set()

    def note(meta) -> None:
        if id(meta) not in seen:
            seen.add(id(meta))
            keep(meta, meta.forward_state(with_history=False))

    with fp8_state_recorder(note):
        yield


@contextlib.contextmanager
def replaying(regions: tuple, original_scales: Callable[[object], Optional[dict]]) -> Iterator[None]:
    """Runs the body as a replay of a forward: inside `regions` (the autocast regions of the
    original forward), each FP8 state casting with original_scales(meta) (None: the scales it
    has), no forward update scheduled; afterwards every state used is put back as it was
    before the replay, amax histories included, so the replay leaves no trace."""
    live: Dict[int, tuple] = {}

    def note(meta) -> None:
        if id(meta) not in live:
            live[id(meta)] = (meta, meta.forward_state())
            original = original_scales(meta)
            if original is not None:
                meta.load_forward_state(original)

    try:
        with fp8_state_recorder(note), recompute_region(regions):
            yield
    finally:  # also when torch stops a non-reentrant recompute early (by raising)
        for meta, state in live.values():
            meta.load_forward_state(state)
