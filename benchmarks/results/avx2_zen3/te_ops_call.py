"""Per-call cost of a small te.ops.Sequential (forward + backward, and forward under no_grad)."""
import time
import torch
import transformer_engine.pytorch as te
ops = te.ops
torch.manual_seed(0)
model = ops.Sequential(ops.MakeExtraOutput(), ops.RMSNorm(64), ops.Linear(64, 64), ops.GELU(), ops.Linear(64, 64),
                       ops.AddExtraInput())
x = torch.randn(4, 64, requires_grad=True)


def train():
    y, res = model(x, torch.zeros(4, 64))
    (y.sum() + res.sum()).backward()


def infer():
    with torch.no_grad():
        model(x, torch.zeros(4, 64))


for name, fn in (("fwd+bwd", train), ("no_grad fwd", infer)):
    for _ in range(200):
        fn()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(500):
            fn()
        best.append((time.perf_counter() - t) / 500 * 1e6)
    print(f"{name:12s} {min(best):7.1f} us per call (min of 5 x 500)")
