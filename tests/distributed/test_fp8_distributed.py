"""Delayed-scaling amaxes are all-reduced (MAX) over the autocast's amax_reduction_group:
two gloo ranks on this machine's loopback, each with its own data, end with the same scales."""
import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from gloo_ranks import run_on_ranks
from numerics import fp32_quotient


def _rank_main(rank: int, world: int):
    torch.manual_seed(0)
    m = te.Linear(16, 8)  # same weights on both ranks
    x = torch.randn(4, 16) * (rank + 1) * 10  # rank 1 has the larger amax
    r = recipe.DelayedScaling(amax_history_len=4)
    with te.autocast(recipe=r, amax_reduction_group=dist.group.WORLD):
        y = m(x)
    y.sum().backward()
    return m.fp8_meta["scaling_fwd"].scale.clone(), x.abs().amax().item()


def test_amax_all_reduced_over_two_ranks():
    results = run_on_ranks(_rank_main, world=2)
    scale0, amax0 = results[0]
    scale1, amax1 = results[1]
    assert torch.equal(scale0, scale1), "both ranks use the reduced (MAX) amax"
    assert torch.equal(scale0[0], fp32_quotient(448.0, max(amax0, amax1)))
