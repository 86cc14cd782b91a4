"""NVFP4's row-wise cast of an 8192 x 4096 bf16 tensor (64 MiB, beyond the caches) with its amax
given, on THREADS threads: `python nvfp4_quantize_threads.py THREADS`. Prints the 20th percentile
of 60 calls, the bytes it must move (read 2, write 0.5 + 1/16 per value) per second, and a
same-process copy of the input for comparison."""
import sys
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.bench.harness import configure_allocator

torch.set_num_threads(int(sys.argv[1]))
configure_allocator()
x = torch.randn(8192, 4096, dtype=torch.bfloat16)
amax = te.kernels.nvfp4_amax(x, False, False)


def p20_ms(call, n=60):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 5] * 1e3


cast = p20_ms(lambda: te.kernels.nvfp4_quantize(x, amax, 1, False, False, None))
y = torch.empty_like(x)
copy = p20_ms(lambda: y.copy_(x))
moved = x.numel() * (2 + 0.5 + 1 / 16)
print(f"threads {sys.argv[1]}: quantize {cast:.2f} ms ({moved / cast / 1e6:.1f} GB/s), "
      f"copy {copy:.2f} ms ({x.numel() * 4 / copy / 1e6:.1f} GB/s)")
