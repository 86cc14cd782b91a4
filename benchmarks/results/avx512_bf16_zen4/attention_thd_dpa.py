"""DotProductAttention over a packed (thd) batch against the flash op alone on the same tensors:
8 sequences of 77 to 2,000 tokens (5,573 in all), 8 heads of 64, bf16, padding_causal, forward +
backward; medians of 7 steps. Run: PYTHONPATH=<repo> .venv/bin/python attention_thd_dpa.py"""
import time, statistics, torch
import transformer_engine.pytorch as te
from transformer_engine.pytorch.custom_ops.attention import flash_attention
torch.manual_seed(0)
lengths = [512, 300, 1024, 77, 900, 2000, 640, 120]
h, d = 8, 64
cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
t = int(cu[-1])
mk = lambda: torch.randn(t, h, d, dtype=torch.bfloat16, requires_grad=True)
q, k, v = mk(), mk(), mk()
g = torch.randn(t, h * d, dtype=torch.bfloat16)
dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
def run_dpa():
    out = dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
    out.backward(g)
def run_op():
    out = flash_attention(q, k, v, d ** -0.5, (-1, 0), False, cu_seqlens_q=cu, cu_seqlens_kv=cu)[0]
    out.reshape(t, h * d).backward(g)
for name, fn in (("dpa", run_dpa), ("op", run_op)):
    fn()
    ts = []
    for _ in range(7):
        s = time.perf_counter(); fn(); ts.append(time.perf_counter() - s)
    print(name, f"{statistics.median(ts)*1e3:.1f} ms", dpa.last_backend if name == "dpa" else "")
