"""DelayedScaling's update of per-tensor FP8 states as one dispatcher op (fp8/state.py calls
it when an autocast region exits, for every state the region used):

    delayed_scaling_update_(amax_histories, scales, scale_invs, recorded, amax_compute_algo,
                            fp8_max, margin) -> None
        for each state: the slots that recorded an amax this step (or whose live amax is not
        0) roll their history and take scale = (fp8_max / amax) / 2**margin (amax: "max" over
        the history or "most_recent"); every scale_inv becomes 1 / scale; recorded is cleared.
        In place. The reference (reference/delayed_scaling.py) serves the accelerators.
"""
from typing import List

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
AMAX_ALGOS = ("max", "most_recent")


def _check(amax_histories, scales, scale_invs, recorded, amax_compute_algo, fp8_max, margin):
    op = "delayed_scaling_update_"
    count = len(amax_histories)
    if not len(scales) == len(scale_invs) == len(recorded) == count:
        raise ValueError(f"{op}: amax_histories, scales, scale_invs and recorded must hold one tensor per state, got "
                         f"{count}, {len(scales)}, {len(scale_invs)} and {len(recorded)}")
    if amax_compute_algo not in AMAX_ALGOS:
        raise ValueError(f"{op}: amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
    if margin < 0:
        raise ValueError(f"{op}: margin must be >= 0, got {margin}")
    for i, (history, scale, scale_inv, took) in enumerate(zip(amax_histories, scales, scale_invs, recorded)):
        if history.dtype != torch.float32 or history.dim() != 2 or history.shape[0] < 1:
            raise ValueError(f"{op}: amax_histories[{i}] must be a float32 [history_len >= 1, slots] tensor, got "
                             f"{history.dtype} of shape {list(history.shape)}")
        for name, t, dtype in (("scales", scale, torch.float32), ("scale_invs", scale_inv, torch.float32),
                               ("recorded", took, torch.bool)):
            if t.dtype != dtype or tuple(t.shape) != (history.shape[1],):
                raise ValueError(f"{op}: {name}[{i}] must be a {dtype} tensor of shape [{history.shape[1]}] (the "
                                 f"history's slots), got {t.dtype} of shape {list(t.shape)}")


@torch.library.register_fake(f"{NAMESPACE}::delayed_scaling_update_")
def _delayed_scaling_update_fake(amax_histories, scales, scale_invs, recorded, amax_compute_algo, fp8_max, margin):
    _check(amax_histories, scales, scale_invs, recorded, amax_compute_algo, fp8_max, margin)


serve_on_accelerators("delayed_scaling_update_", reference.delayed_scaling_update_, check=_check)


def delayed_scaling_update_(amax_histories: List[Tensor], scales: List[Tensor], scale_invs: List[Tensor],
                            recorded: List[Tensor], amax_compute_algo: str, fp8_max: float, margin: float) -> None:
    """The DelayedScaling update of every state given, in place (see the module docstring)."""
    _ops.delayed_scaling_update_(amax_histories, scales, scale_invs, recorded, amax_compute_algo, float(fp8_max),
                                 float(margin))
