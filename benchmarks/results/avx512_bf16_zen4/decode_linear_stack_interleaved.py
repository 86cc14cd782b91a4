"""Issue 48's setup in one process: eight te.Linear(4096, 4096) layers (256 MiB of bf16 weights),
one token through all of them under no_grad, for torch.nn.Linear (eager), te.Linear bf16 and
te.Linear with FP8 / NVFP4 weights from te.quantized_model_init under te.autocast. The kinds take
turns, round after round, with a 128 MiB copy among them, so that the VM's memory bandwidth,
which drifts by up to 1.6x between runs, moves under all of them alike; the ratios are taken
within each round (median over the rounds). `python decode_linear_stack_interleaved.py [ROUNDS]`."""
import statistics
import sys
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

torch.manual_seed(0)
N, LAYERS = 4096, 8
RECIPES = {"DelayedScaling": recipe.DelayedScaling, "Float8CurrentScaling": recipe.Float8CurrentScaling,
           "Float8BlockScaling": recipe.Float8BlockScaling, "NVFP4BlockScaling": recipe.NVFP4BlockScaling}


def stack(rec=None):
    if rec is None:
        return torch.nn.Sequential(*[te.Linear(N, N, bias=False, params_dtype=torch.bfloat16) for _ in range(LAYERS)])
    with te.quantized_model_init(enabled=True, recipe=rec):
        return torch.nn.Sequential(*[te.Linear(N, N, bias=False, params_dtype=torch.bfloat16) for _ in range(LAYERS)])


def token_step(model, rec):
    def step():
        with torch.no_grad():
            if rec is None:
                return model(x)
            with te.autocast(recipe=rec):
                return model(x)
    return step


x = torch.randn(1, N, dtype=torch.bfloat16)
eager = torch.nn.Sequential(*[torch.nn.Linear(N, N, bias=False, dtype=torch.bfloat16) for _ in range(LAYERS)])
steps = {"torch eager": token_step(eager, None), "te bf16": token_step(stack(), None)}
for name, make in RECIPES.items():
    rec = make()
    steps[name] = token_step(stack(rec), rec)
src = torch.empty(LAYERS * N * N // 2, dtype=torch.bfloat16)
dst = torch.empty_like(src)
steps["copy of 128 MiB"] = lambda: dst.copy_(src)


def timed(step, reps=5):
    ts = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        ts.append(time.perf_counter() - start)
    return statistics.median(ts)


for step in steps.values():
    step(), step()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
per_round = [{name: timed(step) for name, step in steps.items()} for _ in range(rounds)]
print(f"{rounds} rounds, median over them; ratios within each round")
print(f"{'kind':22s} {'ms/token':>9s} {'x te bf16':>10s} {'x eager':>8s} {'weights GB/s':>13s} {'% of copy':>10s}")
weight_bytes = {"torch eager": 2, "te bf16": 2, "DelayedScaling": 1, "Float8CurrentScaling": 1,
                "Float8BlockScaling": 1 + 4 / 128 / 128, "NVFP4BlockScaling": 0.5 + 1 / 16}
for name in steps:
    if name == "copy of 128 MiB":
        continue
    ms = statistics.median(r[name] for r in per_round) * 1e3
    vs_bf16 = statistics.median(r["te bf16"] / r[name] for r in per_round)
    vs_eager = statistics.median(r["torch eager"] / r[name] for r in per_round)
    gbs = [LAYERS * N * N * weight_bytes[name] / r[name] / 1e9 for r in per_round]
    of_copy = statistics.median(g / (2 * src.numel() * 2 / r["copy of 128 MiB"] / 1e9) for g, r in zip(gbs, per_round))
    print(f"{name:22s} {ms:9.2f} {vs_bf16:9.2f}x {vs_eager:7.2f}x {statistics.median(gbs):13.1f} {100 * of_copy:9.0f}%")
copy_ms = statistics.median(r["copy of 128 MiB"] for r in per_round)
print(f"copy of 128 MiB: {copy_ms * 1e3:.2f} ms, {2 * src.numel() * 2 / copy_ms / 1e9:.1f} GB/s read + write")
