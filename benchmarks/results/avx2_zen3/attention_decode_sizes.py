"""Decoding one token over a GQA cache ([1, 32 heads, 1, 128] queries, 8 key/value heads of
[S, 128] bf16 keys and values), the flash op alone, repeated: `python attention_decode_sizes.py
CALLS S`. With S = 256 the cache (1 MiB) stays in one core's L2 and the kernel runs as one task
on one core, so the time is the compute's; with S = 8192 (33.5 MB, beyond the 32 MiB L3) it is
the cache read's. Prints the 10th percentile of the calls (the VM's neighbours move the median by
up to 1.5x) and a same-process copy of the cache's bytes for the share of its bytes/s."""
import math
import sys
import time

import torch

from transformer_engine.pytorch.custom_ops.attention import flash_attention

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 300
s = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
b, h, g, d = 1, 32, 8, 128
torch.manual_seed(0)
q = torch.randn(b, h, 1, d, dtype=torch.bfloat16)
k, v = (torch.randn(b, g, s, d, dtype=torch.bfloat16) for _ in range(2))


def tenth_percentile_ms(call, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 10] * 1e3


with torch.no_grad():
    ms = tenth_percentile_ms(lambda: flash_attention(q, k, v, 1 / math.sqrt(d), (-1, 0), True), calls)
src = torch.randn(b * g * s * d)  # fp32: the bf16 keys' and values' bytes
dst = torch.empty_like(src)
copy_ms = tenth_percentile_ms(lambda: dst.copy_(src), 50)
print(f"S={s}: decode p10 {ms:.3f} ms; copy of the cache's bytes {copy_ms:.3f} ms (read + write) -> "
      f"{copy_ms / (2 * ms):.0%} of the copy's bytes/s")
