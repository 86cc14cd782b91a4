"""What DelayedScaling's update costs per FP8 state at an autocast exit (in decoding, once per
token for every te.Linear): update_together over the states of 8 and 64 te.Linear(128, 128)
after one forward each, and the update op alone over 64 states with histories of 1 and 1,024
rows (the recipe's default), every slot marked as recorded before each call (one fill of the
flags, which are rows of one tensor; its own time subtracted).
`python delayed_update_cost.py`."""
import timeit

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.custom_ops.delayed_scaling import delayed_scaling_update_
from transformer_engine.pytorch.fp8.state import FORWARD, update_together


def per_call_us(f, number=200):
    f()
    return min(timeit.repeat(f, number=number, repeat=9)) / number * 1e6


rec = recipe.DelayedScaling()
x = torch.randn(1, 128, dtype=torch.bfloat16)
for count in (8, 64):
    with te.quantized_model_init(enabled=True, recipe=rec):
        model = torch.nn.Sequential(*[te.Linear(128, 128, bias=False, params_dtype=torch.bfloat16)
                                      for _ in range(count)])
    with torch.no_grad(), te.autocast(recipe=rec):
        model(x)
    metas = [layer._meta_for(rec, x.device) for layer in model]
    us = per_call_us(lambda: update_together(metas, FORWARD, None))
    print(f"update_together, {count} states: {us:.1f} us, {us / count:.2f} us per state")

states = 64
flags = torch.zeros(states, 3, dtype=torch.bool)
recorded = list(flags.unbind(0))  # [3] each


def mark():
    flags.fill_(True)


marking = per_call_us(mark)
for rows in (1, 1024):
    histories = [torch.rand(rows, 3) for _ in range(states)]
    scales, scale_invs = [torch.ones(3) for _ in range(states)], [torch.ones(3) for _ in range(states)]

    def update():
        mark()
        delayed_scaling_update_(histories, scales, scale_invs, recorded, "max", 448.0, 0)
    print(f"the op, {states} states of {rows} rows: {(per_call_us(update) - marking) / states:.2f} us per state")
