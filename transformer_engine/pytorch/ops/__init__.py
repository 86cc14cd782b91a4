"""Op wrappers: one file per op family over torch.ops.portable_te."""
from .fp8_block import fp8_block_dequantize, fp8_block_quantize
from .fp8_cast import fp8_dequantize, fp8_quantize, fp8_quantize_transpose
from .norm import layernorm, rmsnorm
from .norm import add_layernorm, add_rmsnorm, layernorm_fp8, rmsnorm_fp8

__all__ = ["layernorm", "rmsnorm", "fp8_quantize", "fp8_quantize_transpose", "fp8_dequantize", "fp8_block_quantize",
           "fp8_block_dequantize",
           "add_layernorm", "add_rmsnorm", "layernorm_fp8", "rmsnorm_fp8"]
