"""Per te.Linear(4096, 4096) forward + backward step under NVFP4BlockScaling (bf16 input [4096, 4096]):
the wall time of the CPU ops of the casts (torch.profiler, nvfp4_* ops but the GEMM), 3 steps."""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from torch.profiler import profile
torch.manual_seed(0)
rec = recipe.NVFP4BlockScaling()
m = te.Linear(4096, 4096, params_dtype=torch.bfloat16)
x = torch.randn(4096, 4096, dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(4096, 4096, dtype=torch.bfloat16)
def step():
    with te.autocast(recipe=rec):
        y = m(x)
    y.backward(g)
step(); step()
with profile() as p:
    for _ in range(3): step()
rows = {e.key: (e.count // 3, e.self_cpu_time_total / 3e3) for e in p.key_averages() if "nvfp4" in e.key}
casts = sum(ms for k, (n, ms) in rows.items() if "gemm" not in k)
print(f"{sys.argv[1]}: casts {casts:.1f} ms/step |", " | ".join(f"{k.split('::')[-1]} x{n} {ms:.1f}" for k, (n, ms) in sorted(rows.items())))
