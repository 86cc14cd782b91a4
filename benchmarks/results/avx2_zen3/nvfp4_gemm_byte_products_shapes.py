"""NVFP4 GEMM alone at the LayerNormMLP shapes of the layer family ([2048 tokens, 1024] x [5632, 1024]
and back), 2 threads, wall per call."""
import sys, torch, time
from transformer_engine.pytorch.custom_ops.nvfp4 import nvfp4_amax, nvfp4_quantize
from transformer_engine.pytorch.custom_ops.nvfp4_gemm import nvfp4_gemm
torch.set_num_threads(2)
def case(m, n, k):
    a = torch.randn(m, k, dtype=torch.bfloat16); b = torch.randn(n, k, dtype=torch.bfloat16)
    qa = nvfp4_quantize(a, nvfp4_amax(a)); qb = nvfp4_quantize(b, nvfp4_amax(b)); alpha = torch.ones(1)
    f = lambda: nvfp4_gemm(qa[0], qa[1], qb[0], qb[1], k, alpha, None, None, None, torch.bfloat16)
    f(); ts = []
    for _ in range(5):
        s = time.perf_counter(); f(); ts.append(time.perf_counter() - s)
    ts.sort(); print(f"{sys.argv[1]} [{m}, {k}] x [{n}, {k}]: {1e3*ts[0]:.1f}-{1e3*ts[2]:.1f} ms (min-median of 5)", flush=True)
for m, n, k in ((2048, 5632, 1024), (2048, 1024, 5632), (64, 4096, 4096)):
    case(m, n, k)
