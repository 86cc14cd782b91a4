"""The decode family's step with layers too small for their GEMMs to matter (hidden 256, ffn 512, 16
heads in 4 groups, 2 layers, 256 tokens cached): what is left is the per-call cost around the
kernels. `python decode_step_overhead.py PROVIDER [PROVIDER ...]` (the decode family's provider
names: ours, ours_fp8, ours_current, ours_block, ours_nvfp4, eager); prints the 10th percentile of
200 steps in ms."""
import sys
import time

import torch

from transformer_engine.bench import decode_cases
from transformer_engine.bench.harness import configure_allocator

configure_allocator()
config = decode_cases.DecodeConfig(block=decode_cases.LlamaConfig(hidden=256, ffn=512, heads=16, groups=4), layers=2,
                                   context=256, batches=(1,), room=512)
case = decode_cases.decode_case(config, 1, torch.bfloat16, torch.device("cpu"))
for name in sys.argv[1:]:
    step = case.providers[name]
    for _ in range(5):
        step()
    times = []
    for _ in range(200):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(f"{name:14s} {sorted(times)[20] * 1e3:.3f} ms per step (2 small layers)")
