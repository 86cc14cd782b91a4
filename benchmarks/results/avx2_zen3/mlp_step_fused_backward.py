"""The layer family's LayerNormMLP and TransformerLayer training steps (te-bench layer_cases:
Llama-style, [4, 512] tokens, no bias) under DelayedScaling, the activation's backward fused
with fc1's gradient cast ("fused": activation_grad_fp8, codes and transpose in one pass) or not
("unfused": activation_bwd, then fp8_quantize_transpose), the two taking turns in one process.
Usage: python mlp_step_fused_backward.py [rounds]. Prints medians in ms."""
import sys
import time

import torch

from transformer_engine.bench.harness import configure_allocator

configure_allocator()
from transformer_engine.bench import layer_cases  # noqa: E402
from transformer_engine.pytorch.module import layernorm_mlp  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
fused_quantizer = layernorm_mlp.grad_operand_quantizer
device = torch.device("cpu")
dtype = layer_cases.step_dtype(device)
steps = {"layernorm_mlp": layer_cases.mlp_case(layer_cases.HEADLINE, dtype, device).providers["ours_fp8"],
         "transformer_layer": layer_cases.layer_case(layer_cases.HEADLINE, dtype, device).providers["ours_fp8"]}


def route(fused: bool) -> None:
    layernorm_mlp.grad_operand_quantizer = fused_quantizer if fused else (lambda producer, bias: None)


for step in steps.values():
    for fused in (False, True):
        route(fused)
        step()
times = {}
for _ in range(rounds):
    for name, step in steps.items():
        for fused in (False, True):
            route(fused)
            start = time.perf_counter()
            step()
            times.setdefault((name, fused), []).append(time.perf_counter() - start)
print(f"{dtype}, {rounds} rounds, {torch.get_num_threads()} threads")
for name in steps:
    unfused, fused = (sorted(times[(name, f)])[rounds // 2] * 1e3 for f in (False, True))
    print(f"{name:18s} unfused {unfused:8.1f} ms   fused {fused:8.1f} ms   saved {unfused - fused:6.1f} ms")
