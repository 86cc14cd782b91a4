"""FP8 machinery: scaling math (scaling.py, pure functions) and the autocast regions
(context.py)."""
from . import scaling
from .context import (Fp8Context, autocast, current_context, fp8_autocast, get_default_recipe, is_bf16_available,
                       is_fp8_available)

__all__ = ["scaling", "Fp8Context", "autocast", "fp8_autocast", "current_context", "get_default_recipe",
           "is_fp8_available", "is_bf16_available"]
