"""One [4096]^3 GEMM alone, NVFP4 codes (row-wise 1 x 16 casts) against FP8 E4M3, bf16 out, taking
turns three times: `python nvfp4_fp8_gemm_alone.py THREADS` (wall and process CPU seconds)."""
import sys, torch, time
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize
from transformer_engine.pytorch.custom_ops.nvfp4_gemm import nvfp4_gemm
from transformer_engine.pytorch.custom_ops.scaled_gemm import scaled_gemm
torch.set_num_threads(int(sys.argv[1]))
n = 4096
a = torch.randn(n, n, dtype=torch.bfloat16); b = torch.randn(n, n, dtype=torch.bfloat16)
qa = nvfp4_quantize(a, nvfp4_amax(a)); qb = nvfp4_quantize(b, nvfp4_amax(b))
alpha = torch.ones(1, dtype=torch.float32)
one = torch.ones((), dtype=torch.float32)
def nv(): return nvfp4_gemm(qa[0], qa[1], qb[0], qb[1], n, alpha, None, None, None, torch.bfloat16)
def f8(): return scaled_gemm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), one, one, None, torch.bfloat16)
for f in (nv, f8): f()
for r in range(3):
    for name, f in (("nvfp4", nv), ("fp8", f8)):
        s = time.perf_counter(); c0 = time.process_time(); f(); print(name, f"wall {time.perf_counter()-s:.3f} cpu {time.process_time()-c0:.3f}", flush=True)
