"""NVFP4 casts of a [4096, 4096] bf16 tensor, column-wise (1 x 16 and 16 x 16) and row-wise: the
third fastest of 15 calls each in ms. `python nvfp4_transposed_cast.py THREADS`."""
import sys
import time

import torch

from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize
torch.set_num_threads(int(sys.argv[1]))
x = torch.randn(4096, 4096, dtype=torch.bfloat16); amax = nvfp4_amax(x)
def best(f, n=15):
    f(); t=[]
    for _ in range(n):
        s=time.perf_counter(); f(); t.append(time.perf_counter()-s)
    return sorted(t)[2]*1e3
print(" ".join(f"{name} {best(lambda: nvfp4_quantize(x, amax, **kw)):.1f}" for name, kw in
      [("T", dict(transpose=True)), ("T16", dict(transpose=True, block_rows=16)), ("row", {})]))
