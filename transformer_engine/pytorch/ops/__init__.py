"""Op wrappers: one file per op family over torch.ops.portable_te."""
from .activation import (activation, activation_fp8, clamped_swiglu, geglu, gelu, glu, qgeglu, qgelu, reglu, relu,
                         silu, sreglu, srelu, swiglu)
from .fp8_block import fp8_block_dequantize, fp8_block_quantize
from .fp8_cast import fp8_dequantize, fp8_quantize, fp8_quantize_transpose
from .norm import layernorm, rmsnorm

__all__ = ["layernorm", "rmsnorm", "fp8_quantize", "fp8_quantize_transpose", "fp8_dequantize", "fp8_block_quantize",
           "fp8_block_dequantize", "activation", "activation_fp8", "gelu", "qgelu", "relu", "srelu", "silu", "glu",
           "geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu"]
