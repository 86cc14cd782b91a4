"""DelayedScaling's update of FP8 states in plain PyTorch, with the op's signature
(custom_ops/delayed_scaling.py): scaling.py's pure functions, one state at a time, each state's
tensors written in place."""
from typing import List

import torch
from torch import Tensor

from .. import scaling


def delayed_scaling_update_(amax_histories: List[Tensor], scales: List[Tensor], scale_invs: List[Tensor],
                            recorded: List[Tensor], amax_compute_algo: str, fp8_max: float, margin: float) -> None:
    for history, scale, scale_inv, took in zip(amax_histories, scales, scale_invs, recorded):
        takes_part = took | (history[0] != 0)  # [slots]
        amax = scaling.compute_amax(history, amax_compute_algo)
        new_scale = torch.where(takes_part, scaling.delayed_scale(amax, scale, fp8_max, margin), scale)
        history.copy_(torch.where(takes_part, scaling.roll_amax_history(history), history))
        scale.copy_(new_scale)
        scale_inv.copy_(torch.reciprocal(new_scale))
        took.zero_()
