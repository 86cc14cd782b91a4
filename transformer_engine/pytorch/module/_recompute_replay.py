"""The replay of a module's last FP8 forward when torch.utils.checkpoint recomputes it in
backward outside every te.autocast region (Hugging Face's gradient checkpointing): the forwards
of FP8 modules (and of te.ops.Sequential) are decorated with replays_fp8_forward, which runs
them as te.checkpoint's replay does (fp8/replay.py), from the records each FP8 forward leaves
(Fp8ModuleMixin._record_fp8_forward)."""
import functools
from typing import Callable

import torch

from ..fp8.context import current_context
from ..fp8.replay import replaying_records


def replays_fp8_forward(forward: Callable) -> Callable:
    """Decorates the forward of a module holding FP8 modules (itself included). A forward that
    torch.utils.checkpoint recomputes in backward (Hugging Face's gradient checkpointing),
    outside every te.autocast region, repeats the FP8 forward each of those modules last
    ran: it runs as te.checkpoint's replay does (fp8/replay.py), inside that forward's regions,
    each FP8 state casting with the scales it had then, and every state put back afterwards.
    (Non-reentrant checkpointing checks that the recompute saves the same tensors.)"""

    @functools.wraps(forward)
    def run(module: torch.nn.Module, *args, **kwargs):
        replay = _recompute_replay(module)
        if replay is None:
            return forward(module, *args, **kwargs)
        with replay:
            return forward(module, *args, **kwargs)
    return run


def _recompute_replay(module: torch.nn.Module):
    """The replay of module's last FP8 forward when this forward is a recompute of it in
    backward outside every region; else None."""
    if not _recomputing_in_backward() or current_context() is not None:
        return None
    return replaying_records([m._fp8_forward_record for m in module.modules()
                              if getattr(m, "_fp8_forward_record", None)])


def _recomputing_in_backward() -> bool:
    """A forward running inside the autograd engine's backward: a checkpoint's recompute.
    (Never while tracing: torch.compile handles checkpointed regions itself.)"""
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1
