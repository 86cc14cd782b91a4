"""The weight's column-wise usage at [4096, 4096] bf16: the cast of x^T in 16 x 16 tiles against
nvfp4_transpose_tiles of the row-wise codes (20th percentile of 20 calls each, 3 rounds): `python
nvfp4_transpose_tiles_time.py THREADS`."""
import torch, time, sys
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize, nvfp4_transpose_tiles
torch.set_num_threads(int(sys.argv[1]))
x = torch.randn(4096, 4096, dtype=torch.bfloat16)
amax = nvfp4_amax(x)
data, scales = nvfp4_quantize(x, amax, 16)
def p20(f, n=20):
    f(); t=[]
    for _ in range(n):
        s=time.perf_counter(); f(); t.append(time.perf_counter()-s)
    return sorted(t)[n//5]*1e3
y = torch.empty_like(x)
for r in range(3):
    print(f"copy {p20(lambda: y.copy_(x)):.2f} | cast of x^T, 16x16 {p20(lambda: nvfp4_quantize(x, amax, 16, True)):.2f} | "
          f"transpose_tiles {p20(lambda: nvfp4_transpose_tiles(data, scales, 4096)):.2f} ms")
