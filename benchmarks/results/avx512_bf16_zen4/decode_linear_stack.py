"""Issue 48's decoding figure: eight te.Linear(4096, 4096) layers (256 MiB of bf16 weights), one
token [1, 4096] through all of them under no_grad, ms per token (median of 20), beside a same-run
copy of 128 MiB. `python decode_linear_stack.py KIND` with KIND one of eager (torch.nn.Linear),
bf16 (te.Linear), delayed, current, block, mxfp8, nvfp4 (weights from te.quantized_model_init of
that recipe, run inside te.autocast of it)."""
import sys
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

N, LAYERS = 4096, 8
RECIPES = {"delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling,
           "block": recipe.Float8BlockScaling, "mxfp8": recipe.MXFP8BlockScaling, "nvfp4": recipe.NVFP4BlockScaling}


def median_ms(f, calls=20):
    for _ in range(3):
        f()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2] * 1e3


def main(kind: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, N, dtype=torch.bfloat16)
    fp8_recipe = RECIPES[kind]() if kind in RECIPES else None
    if kind == "eager":
        model = torch.nn.Sequential(*[torch.nn.Linear(N, N, bias=False, dtype=torch.bfloat16) for _ in range(LAYERS)])
    else:
        with te.quantized_model_init(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            model = torch.nn.Sequential(*[te.Linear(N, N, bias=False, params_dtype=torch.bfloat16)
                                          for _ in range(LAYERS)])

    def token():
        with torch.no_grad(), te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            return model(x)
    src = torch.empty(LAYERS * N * N // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy = median_ms(lambda: dst.copy_(src))
    print(f"{kind}: {median_ms(token):.2f} ms/token; copy of 128 MiB {copy:.2f} ms "
          f"({2 * src.numel() * 2 / copy / 1e6:.1f} GB/s read + write)")


if __name__ == "__main__":
    main(sys.argv[1])
