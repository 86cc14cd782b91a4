"""transformer_engine.pytorch.quantization: where TransformerEngine 2.x keeps its FP8 entry
points (the same objects as transformer_engine.pytorch.fp8)."""
from .fp8 import (FP8GlobalStateManager, autocast, check_fp8_block_scaling_support, check_fp8_support,
                  check_mxfp8_support, fp8_autocast, fp8_model_init, get_default_fp8_recipe, get_default_recipe,
                  get_fp8_max, get_fp8_torch_dtype, quantized_model_init)

__all__ = ["FP8GlobalStateManager", "autocast", "fp8_autocast", "fp8_model_init", "quantized_model_init",
           "check_fp8_support", "check_mxfp8_support", "check_fp8_block_scaling_support", "get_default_fp8_recipe",
           "get_default_recipe", "get_fp8_max", "get_fp8_torch_dtype"]
