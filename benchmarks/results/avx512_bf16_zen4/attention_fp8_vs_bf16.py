"""FP8 attention ops against the bf16 flash ops at [1, 4096, 8, 128], causal, medians of 7 calls
(issue 46; run from the repository root with the package importable)."""
import time

import torch

import transformer_engine.pytorch  # noqa: F401  (registers the ops)
ops = torch.ops.portable_te
torch.manual_seed(0)
b, s, h, d = 1, 4096, 8, 128
def codes(*sh): return (torch.randn(*sh) * 2).to(torch.float8_e4m3fn).to(torch.bfloat16)
q, k, v, go = codes(b, h, s, d), codes(b, h, s, d), codes(b, h, s, d), codes(b, h, s, d)
sc = torch.tensor([0.5, 0.25, 0.5, 448.0, 1 / 448.0]); bsc = torch.tensor([0.5, 0.25, 0.5, 0.5, 0.5, 448., 1/448., 4096., 1/4096.])
base = (None,) * 10
def bf16_fwd(): return ops.flash_attention_fwd(q, k, v, *base, d ** -0.5, -1, 0, False, 0.0, 0.0, False)
def fp8_fwd(): return ops.flash_attention_fp8_fwd(q, k, v, *base, d ** -0.5, -1, 0, False, 0.0, False, sc)
o, l, _ = bf16_fwd(); o8, l8, _, _ = fp8_fwd()
o8 = (o8 * 2).to(torch.float8_e4m3fn).to(torch.bfloat16)  # O's codes (out_si 0.5)
def bf16_bwd(): return ops.flash_attention_bwd(go, q, k, v, o, l, *base, d ** -0.5, -1, 0, False, 0.0, 0.0, False)
def fp8_bwd(): return ops.flash_attention_fp8_bwd(go, q, k, v, o8, l8, *base, d ** -0.5, -1, 0, False, 0.0, False, bsc, 1)
def med(f, n=7):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2] * 1e3
for name, f in [("bf16 fwd", bf16_fwd), ("fp8 fwd", fp8_fwd), ("bf16 bwd", bf16_bwd), ("fp8 bwd", fp8_bwd)]:
    print(f"{name}: {med(f):.1f} ms")
