"""te.Linear(1024, 5632) forward + backward over 2048 tokens under each recipe, its FP8 / NVFP4
GEMMs routed two ways on a CPU whose GEMMs are fp32 (no AVX512-BF16 or AMX), the two taking
turns in one process: "dequantised" (the route before: more than 16 rows of a dequantised to
fp32 for ATen's fp32 GEMM) and "codes" (our gemm_bf16 kernel widening the codes as it reads
them, at every size).
Usage: python fp8_gemm_route.py [float32|bfloat16] [rounds]. Prints medians in ms."""
import sys
import time
import warnings

import torch

from transformer_engine.bench.harness import configure_allocator

configure_allocator()
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402
from transformer_engine.pytorch.fp8 import gemm as fp8_gemm, nvfp4_gemm  # noqa: E402

warnings.filterwarnings("ignore", message="Recipe type changed")
dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
RECIPES = dict(delayed=recipe.DelayedScaling(), current=recipe.Float8CurrentScaling(),
               block=recipe.Float8BlockScaling(), mxfp8=recipe.MXFP8BlockScaling(), nvfp4=recipe.NVFP4BlockScaling())
kernel_takes_codes, kernel_reads_nvfp4 = fp8_gemm._bf16_sums, nvfp4_gemm._reads_codes


def route(codes: bool) -> None:
    """codes: every exact operand to our kernel; else only a's few rows (decoding), as before
    1b7f08a (FP8) and this file's commit (NVFP4)."""
    def few_rows(a) -> bool:
        return (a.data if isinstance(a, (fp8_gemm.Float8Codes, nvfp4_gemm.Nvfp4Usage)) else
                fp8_gemm._blocks(a)).shape[0] <= 16
    fp8_gemm._bf16_sums = kernel_takes_codes if codes else (lambda a, b: kernel_takes_codes(a, b) and few_rows(a))
    nvfp4_gemm._reads_codes = kernel_reads_nvfp4 if codes else (lambda a: kernel_reads_nvfp4(a) and few_rows(a))


torch.manual_seed(0)
linear = te.Linear(1024, 5632, bias=False, params_dtype=dtype)
x = torch.randn(2048, 1024, dtype=dtype, requires_grad=True)
dy = torch.randn(2048, 5632, dtype=dtype)


def step(rec) -> None:
    with te.autocast(recipe=rec):
        y = linear(x)
    torch.autograd.grad(y, (x, linear.weight), dy)


times = {}
for name, rec in RECIPES.items():
    for codes in (False, True):
        route(codes)
        step(rec)
for _ in range(rounds):
    for name, rec in RECIPES.items():
        for codes in (False, True):
            route(codes)
            start = time.perf_counter()
            step(rec)
            times.setdefault((name, codes), []).append(time.perf_counter() - start)
print(f"{dtype}, {rounds} rounds, {torch.get_num_threads()} threads")
for name in RECIPES:
    dequantised, codes = (sorted(times[(name, c)])[rounds // 2] * 1e3 for c in (False, True))
    print(f"{name:8s} dequantised {dequantised:7.1f} ms   codes {codes:7.1f} ms   {dequantised / codes:.2f}x")
