"""Where the FP8 TransformerLayer step spends its time against its floor's parts."""
import sys, time
import torch
from transformer_engine.bench import layer_cases as lc
from transformer_engine.common import recipe
import transformer_engine.pytorch as te

torch.manual_seed(0)
cfg, dev = lc.HEADLINE, torch.device("cpu")
dtype = lc.step_dtype(dev)
case = lc.layer_case(cfg, dtype, dev)
step = case.providers["ours_fp8"]
att = lc.attention_gemms(lc.attention_shape(cfg), dtype, dev)
floor8 = case.providers["gemm_floor_fp8"]
lin_only = lc.gemm_floor(lc.linear_weights(cfg, True), cfg.batch * cfg.seq, dtype, dev, fp8=True)

def best(fn, n=3):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts) * 1e3, sorted(ts)[len(ts) // 2] * 1e3

for _ in range(2):
    step()
print(f"dtype {dtype}")
for name, fn in [("step", step), ("floor_fp8", floor8), ("fp8 linear gemms", lin_only),
                 ("attention bmm floor", lambda: [g() for g in att]), ("step", step)]:
    print(f"{name:24s} min {best(fn)[0]:8.1f} ms  p50 {best(fn)[1]:8.1f}")
if len(sys.argv) > 1:
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=35, max_name_column_width=50))
