"""FP8 machinery: the autocast regions (context.py), FP8 operands (codes.py, block_tensor.py),
per-module state (state.py), FP8 parameters (quantized_tensor.py, made by model_init.py), the
replay of a recomputed forward (replay.py), and TransformerEngine's global-state queries over
them (global_state.py; transformer_engine.pytorch.fp8 is where TE code imports
FP8GlobalStateManager and check_fp8_support from). The scaling math they use lives on the
ground floor (../scaling.py), below the reference ops that use it too."""
from .. import scaling  # the scaling math (pure functions, on the ground floor), also at te.fp8.scaling
from .context import (Fp8Context, autocast, current_context, fp8_autocast, get_default_recipe, is_bf16_available,
                       is_fp8_available, is_fp8_block_scaling_available, is_mxfp8_available, is_nvfp4_available)
from .global_state import (FP8GlobalStateManager, check_fp8_block_scaling_support, check_fp8_support,
                           check_mxfp8_support, check_nvfp4_support, get_default_fp8_recipe, get_fp8_max,
                           get_fp8_te_dtype, get_fp8_torch_dtype)
from .model_init import fp8_model_init, quantized_model_init
from .quantized_tensor import QuantizedTensor

__all__ = ["scaling", "Fp8Context", "autocast", "fp8_autocast", "current_context", "get_default_recipe",
           "is_fp8_available", "is_mxfp8_available", "is_fp8_block_scaling_available", "is_nvfp4_available",
           "is_bf16_available", "quantized_model_init", "fp8_model_init", "QuantizedTensor", "FP8GlobalStateManager", "check_fp8_support",
           "check_mxfp8_support", "check_fp8_block_scaling_support", "check_nvfp4_support", "get_default_fp8_recipe",
           "get_fp8_te_dtype", "get_fp8_torch_dtype",
           "get_fp8_max"]
