"""The NVFP4 cast variants a te.Linear step under NVFP4BlockScaling runs, on a [4096, 4096] bf16
tensor: `python nvfp4_cast_variants.py THREADS`; the 20th percentile of 20 calls each, and a copy of
the tensor."""
import torch, time, sys
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize
from transformer_engine.bench.harness import configure_allocator; configure_allocator()
torch.set_num_threads(int(sys.argv[1]))
x = torch.randn(4096, 4096, dtype=torch.bfloat16)
amax = nvfp4_amax(x)
rng = torch.tensor([1234, 0], dtype=torch.int64)
def p20(f, n=20):
    f(); t=[]
    for _ in range(n):
        s=time.perf_counter(); f(); t.append(time.perf_counter()-s)
    return sorted(t)[n//5]*1e3
y = torch.empty_like(x)
print(f"copy {p20(lambda: y.copy_(x)):.2f} ms")
for name, kw in [("rowwise", {}), ("rowwise 16x16", dict(block_rows=16)), ("transpose", dict(transpose=True)),
                 ("transpose 16x16", dict(block_rows=16, transpose=True)),
                 ("rowwise rht", dict(rht=True)), ("transpose rht", dict(transpose=True, rht=True)),
                 ("rowwise sr", dict(sr_rng=rng)), ("transpose rht sr", dict(transpose=True, rht=True, sr_rng=rng))]:
    try:
        print(f"{name:18s} {p20(lambda: nvfp4_quantize(x, amax, **kw)):.2f} ms")
    except Exception as e:
        print(name, "ERR", str(e)[:100])
