"""Before/after check of issue 29's refactor: (1) the small FP8 LayerNormMLP training step,
(2) per-call overhead of te modules against torch.nn on tiny inputs. Run with the repo to
measure as the first sys.path entry. Prints JSON."""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import transformer_engine.pytorch as te
from transformer_engine.common import recipe
torch.manual_seed(0)

def timed(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps

def rounds(fns, reps, n_rounds=15):
    """Interleaved rounds: per-round times of every fn; medians returned."""
    for fn in fns.values():
        timed(fn, max(1, reps // 4))
    per = {k: [] for k in fns}
    for _ in range(n_rounds):
        for k, fn in fns.items():
            per[k].append(timed(fn, reps))
    return per

out = {}
# (1) FP8 LayerNormMLP step, DelayedScaling, bf16 params, [512, 1024] -> ffn 4096
mlp = te.LayerNormMLP(1024, 4096, params_dtype=torch.bfloat16)
x = torch.randn(512, 1024, dtype=torch.bfloat16, requires_grad=True)
rec = recipe.DelayedScaling()
def mlp_step():
    with te.autocast(recipe=rec):
        y = mlp(x)
    y.float().sum().backward()
def mlp_step_bf16():
    mlp(x).float().sum().backward()
per = rounds({"fp8": mlp_step, "bf16": mlp_step_bf16}, reps=3, n_rounds=9)
out["layernorm_mlp_step_ms"] = {k: 1e3 * statistics.median(v) for k, v in per.items()}
# (2) call overhead on [4, 768] fp32
h = 768
pairs = {
    "LayerNorm": (te.LayerNorm(h), torch.nn.LayerNorm(h)),
    "RMSNorm": (te.RMSNorm(h), torch.nn.RMSNorm(h)),
    "Linear": (te.Linear(h, h), torch.nn.Linear(h, h)),
    "LayerNormLinear": (te.LayerNormLinear(h, h), torch.nn.Sequential(torch.nn.LayerNorm(h), torch.nn.Linear(h, h))),
    "LayerNormMLP": (te.LayerNormMLP(h, 4 * h), torch.nn.Sequential(torch.nn.LayerNorm(h), torch.nn.Linear(h, 4 * h), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * h, h))),
}
for grad in (True, False):
    xs = torch.randn(4, h, requires_grad=grad)
    for name, (ours, plain) in pairs.items():
        ctx = torch.enable_grad if grad else torch.no_grad
        def run(m):
            def f():
                with ctx():
                    m(xs)
            return f
        per = rounds({"ours": run(ours), "torch": run(plain)}, reps=200)
        ratios = [a / b for a, b in zip(per["ours"], per["torch"])]
        out[f"overhead_{name}_{'grad' if grad else 'nograd'}"] = {
            "ours_us": 1e6 * statistics.median(per["ours"]), "torch_us": 1e6 * statistics.median(per["torch"]),
            "ratio": statistics.median(ratios)}
print(json.dumps(out))
