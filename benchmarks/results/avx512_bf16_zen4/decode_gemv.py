"""One decoding GEMM, [m, 4096] x [4096, 4096] (m = 1 by default: `python decode_gemv.py M`), over eight
different weights in turn (so that none stays in the caches), per weight format: bf16 through
ATen's GEMM and ours, FP8 E4M3 codes per tensor (quantised with TE's scale, 448 / amax, and as
the plain cast of the weights, whose codes are mostly zeros and subnormals: the logs before
2026-12-07 have only the plain cast, as "fp8 tensor"), 128 x 128 block-scaled (pow2) and MXFP8 (1 x 32,
E8M0), and NVFP4; ms per weight and the weights' GB/s against a same-run copy of 128 MiB.
`python decode_gemv.py M ROUNDS`: the cases and the copy take turns ROUNDS times (default 1), and
each figure is the median over the rounds (the VM's bandwidth drifts between runs)."""
import statistics, time, torch, sys
from transformer_engine.pytorch.custom_ops.scaled_gemm import scaled_gemm
from transformer_engine.pytorch.custom_ops.nvfp4_gemm import nvfp4_gemm
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize
from transformer_engine.pytorch.custom_ops.fp8_block_gemm import fp8_block_gemm
ops = torch.ops.portable_te
torch.manual_seed(0)
n, L = 4096, 8
m = int(sys.argv[1]) if len(sys.argv) > 1 else 1
one = torch.ones(1)
x = torch.randn(m, n, dtype=torch.bfloat16)
ws = [torch.randn(n, n, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
fp8 = [(w * (448.0 / w.abs().max())).to(torch.float8_e4m3fn) for w in ws]
fp8_cast = [w.to(torch.float8_e4m3fn) for w in ws]
odd = [((f.view(torch.uint8) & 0x7F) < 8).view(-1, 32) for f in fp8]  # zero and subnormal codes, runs of 32
print(f"TE-scaled per-tensor codes: {sum(int(o.sum()) for o in odd) / (L * n * n):.2e} zero or subnormal, "
      f"{sum(int(o.any(1).sum()) for o in odd) / (L * n * n / 32):.2%} of the runs of 32 codes hold one")
nv = [nvfp4_quantize(w, nvfp4_amax(w)) for w in ws]
xa = nvfp4_quantize(x, nvfp4_amax(x))
blk = [ops.fp8_block_quantize(w.float(), 128, 128, torch.float8_e4m3fn, "pow2", 0.0) for w in ws]
xb = ops.fp8_block_quantize(x.float(), 1, 128, torch.float8_e4m3fn, "pow2", 0.0)
mx = [ops.fp8_block_quantize(w.float(), 1, 32, torch.float8_e4m3fn, "e8m0", 0.0) for w in ws]
xm = ops.fp8_block_quantize(x.float(), 1, 32, torch.float8_e4m3fn, "e8m0", 0.0)
xc = x.to(torch.float8_e4m3fn)
cases = {
  "bf16 aten mm": (lambda i: torch.mm(x, ws[i].t()), 2),
  "bf16 ours": (lambda i: scaled_gemm(x, ws[i], None, None, None, torch.bfloat16), 2),
  "fp8 tensor": (lambda i: scaled_gemm(xc, fp8[i], one, one, None, torch.bfloat16), 1),
  "fp8 plain cast": (lambda i: scaled_gemm(xc, fp8_cast[i], one, one, None, torch.bfloat16), 1),
  "fp8 128x128": (lambda i: fp8_block_gemm(xb[0], xb[1], [1, 128], False, blk[i][0], blk[i][1], [128, 128], False, None, torch.bfloat16), 1 + 4 / 128 / 128),
  "mxfp8": (lambda i: fp8_block_gemm(xm[0], xm[1], [1, 32], False, mx[i][0], mx[i][1], [1, 32], False, None, torch.bfloat16), 1 + 1 / 32),
  "nvfp4": (lambda i: nvfp4_gemm(xa[0], xa[1], nv[i][0], nv[i][1], n, one, None, None, None, torch.bfloat16), 0.5 + 1 / 16),
}
src = torch.empty(L * n * n // 2, dtype=torch.bfloat16); dst = torch.empty_like(src)
def timed(f, reps=7):
    f(); ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[reps // 2]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
times = {name: [] for name in [*cases, "copy"]}
for _ in range(rounds):
    times["copy"].append(timed(lambda: dst.copy_(src)))
    for name, (f, _) in cases.items():
        times[name].append(timed(lambda: [f(i) for i in range(L)]) / L)
copy = statistics.median(times["copy"])
copy_gbs = 2 * src.numel() * 2 / copy / 1e9
print(f"copy {copy*1e3:.2f} ms {copy_gbs:.1f} GB/s (read + write), median of {rounds} rounds")
for name, (f, bytes_per) in cases.items():
    t = statistics.median(times[name])
    gbs = n * n * bytes_per / t / 1e9
    print(f"{name:14s} m={m}: {t*1e3:.3f} ms/layer  weights {gbs:.1f} GB/s  {100*gbs/copy_gbs:.0f}% of copy")
