"""The widening's own cost: one [1, 4096] x [4096, 96] GEMM per weight format on one thread, its
operands in L2 (no memory stream to wait on), the third-fastest of 1,500 calls in microseconds.
"call only" is the op's cost around the kernel (one column of b). "fp8 scaled" holds codes
quantised with TE's scale (448 / amax), "fp8 cast" the plain cast of N(0, 0.02) weights (mostly
zero and subnormal codes, as DelayedScaling's first scale of 1 makes them)."""
import time, torch
from transformer_engine.pytorch.custom_ops.scaled_gemm import scaled_gemm
from transformer_engine.pytorch.custom_ops.nvfp4_gemm import nvfp4_gemm
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize
from transformer_engine.pytorch.custom_ops.fp8_block_gemm import fp8_block_gemm
ops = torch.ops.portable_te
torch.set_num_threads(1); torch.manual_seed(0)
n, k = 96, 4096
x = torch.randn(1, k, dtype=torch.bfloat16); xc = x.to(torch.float8_e4m3fn); one = torch.ones(1)
w = torch.randn(n, k) * 0.02
nv = nvfp4_quantize(w.bfloat16(), nvfp4_amax(w.bfloat16())); xa = nvfp4_quantize(x, nvfp4_amax(x))
blk = ops.fp8_block_quantize(w, 128, 128, torch.float8_e4m3fn, "pow2", 0.0)
xb = ops.fp8_block_quantize(x.float(), 1, 128, torch.float8_e4m3fn, "pow2", 0.0)
wb, wc, ws = w.bfloat16(), (w * (448 / w.abs().max())).to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
cases = {"bf16": lambda: scaled_gemm(x, wb, None, None, None, torch.bfloat16),
         "fp8 scaled": lambda: scaled_gemm(xc, wc, one, one, None, torch.bfloat16),
         "fp8 cast": lambda: scaled_gemm(xc, ws, one, one, None, torch.bfloat16),
         "fp8 128x128": lambda: fp8_block_gemm(xb[0], xb[1], [1, 128], False, blk[0], blk[1], [128, 128], False, None, torch.bfloat16),
         "nvfp4": lambda: nvfp4_gemm(xa[0], xa[1], nv[0], nv[1], k, one, None, None, None, torch.bfloat16),
         "call only (n=1 bf16)": lambda: scaled_gemm(x, wb[:1], None, None, None, torch.bfloat16)}
for name, f in cases.items():
    for _ in range(50): f()
    ts = []
    for _ in range(1500):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort()
    best = ts[2]
    print(f"{name:12s} {best*1e6:7.1f} us  {n*k/best/1e9:5.2f} G values/s (one core, in L2)")
