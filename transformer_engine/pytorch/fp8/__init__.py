"""FP8 machinery: scaling math (scaling.py, pure functions), the autocast regions
(context.py), FP8 operands (tensor.py, block_tensor.py), per-module state (state.py) and FP8
parameters (quantized_tensor.py, made by model_init.py)."""
from . import scaling
from .context import (Fp8Context, autocast, current_context, fp8_autocast, get_default_recipe, is_bf16_available,
                       is_fp8_available)
from .model_init import fp8_model_init, quantized_model_init
from .quantized_tensor import QuantizedTensor

__all__ = ["scaling", "Fp8Context", "autocast", "fp8_autocast", "current_context", "get_default_recipe",
           "is_fp8_available", "is_bf16_available", "quantized_model_init", "fp8_model_init", "QuantizedTensor"]
