"""The decoding GEMV ([1, 4096] x [4096, 4096], eight weights in turn) against a pass that only reads
the same bytes (a sum over them), bf16 and FP8 E4M3 weights, on THREADS threads: `python
decode_gemv_vs_read.py THREADS`; the median of 9 passes over the eight weights, ms per weight and
GB/s of the weight bytes, three rounds."""
import time, torch, sys
from transformer_engine.pytorch.custom_ops.scaled_gemm import scaled_gemm
torch.set_num_threads(int(sys.argv[1]))
n, L = 4096, 8
one = torch.ones(1)
x = torch.randn(1, n, dtype=torch.bfloat16)
ws = [torch.randn(n, n, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
fp8 = [(w * (448.0 / w.abs().max())).to(torch.float8_e4m3fn) for w in ws]
xc = x.to(torch.float8_e4m3fn)
def med(f, reps=9):
    ts=[]
    for _ in range(reps):
        t=time.perf_counter()
        for i in range(L): f(i)
        ts.append((time.perf_counter()-t)/L)
    ts.sort(); return ts[reps//2]
res = {}
for rnd in range(3):
    for name, f, nbytes in [("bf16 ours", lambda i: scaled_gemm(x, ws[i], None, None, None, torch.bfloat16), 2*n*n),
                            ("bf16 read (sum)", lambda i: ws[i].view(torch.float32).sum(), 2*n*n),
                            ("fp8 ours", lambda i: scaled_gemm(xc, fp8[i], one, one, None, torch.bfloat16), n*n),
                            ("fp8 read (sum)", lambda i: fp8[i].view(torch.float32).sum(), n*n)]:
        t = med(f); res.setdefault(name, []).append((t*1e3, nbytes/t/1e9))
for k, v in res.items(): print(f"threads {sys.argv[1]} {k:16s} " + "  ".join(f"{a:.2f} ms {b:.1f} GB/s" for a, b in v))
