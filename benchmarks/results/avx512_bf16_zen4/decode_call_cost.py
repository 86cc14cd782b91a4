"""What a te.Linear costs around its GEMM at one token: eight te.Linear(128, 128) (GEMMs of a few
microseconds) with weights from te.quantized_model_init, one token through all of them under
no_grad and te.autocast, microseconds per layer (the autocast exit's scaling update included);
and the input's cast alone. `python decode_call_cost.py`."""
import statistics
import timeit

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module._fp8_call import ONE_GEMM, gemm_quantizers
from transformer_engine.pytorch.tensor.quantizer import operand_for

N, LAYERS = 128, 8
RECIPES = {"bf16 (no autocast)": None, "DelayedScaling": recipe.DelayedScaling,
           "Float8CurrentScaling": recipe.Float8CurrentScaling, "Float8BlockScaling": recipe.Float8BlockScaling,
           "NVFP4BlockScaling": recipe.NVFP4BlockScaling}


def per_call_us(f, number=500):
    f()
    return min(timeit.repeat(f, number=number, repeat=7)) / number * 1e6


x = torch.randn(1, N, dtype=torch.bfloat16)
print(f"{'recipe':22s} {'us per layer':>13s} {'input cast us':>14s}")
for name, make in RECIPES.items():
    rec = make() if make else None
    with te.quantized_model_init(enabled=rec is not None, recipe=rec):
        model = torch.nn.Sequential(*[te.Linear(N, N, bias=False, params_dtype=torch.bfloat16) for _ in range(LAYERS)])

    def step():
        with torch.no_grad():
            if rec is None:
                return model(x)
            with te.autocast(recipe=rec):
                return model(x)
    layer_us = statistics.median(per_call_us(step) for _ in range(3)) / LAYERS
    cast_us = float("nan")
    if rec is not None:
        with torch.no_grad(), te.autocast(recipe=rec):
            quantizer = gemm_quantizers(rec, model[0].fp8_meta, False, ONE_GEMM[0]).input
            cast_us = per_call_us(lambda: operand_for(quantizer, x))
    print(f"{name:22s} {layer_us:13.1f} {cast_us:14.1f}")
