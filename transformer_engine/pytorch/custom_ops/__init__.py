"""transformer_engine.pytorch.custom_ops (te.kernels): this package's fused kernels as functions,
one file per op family over the torch.ops.portable_te dispatcher ops (te.kernels.gelu(x),
te.kernels.layernorm(...), ...). TransformerEngine's fusible-operation modules are te.ops."""
from .activation import (activation, activation_fp8, activation_grad_fp8, clamped_swiglu, geglu, gelu, glu, qgeglu,
                         qgelu, reglu, relu, silu, sreglu, srelu, swiglu)
from .adam import multi_tensor_adam
from .attention import flash_attention
from .attention_fp8 import flash_attention_fp8_backward, flash_attention_fp8_forward
from .cross_entropy import cross_entropy
from .delayed_scaling import delayed_scaling_update_
from .fp8_block import fp8_block_dequantize, fp8_block_quantize
from .fp8_cast import fp8_dequantize, fp8_quantize, fp8_quantize_current, fp8_quantize_transpose
from .norm import add_layernorm, add_rmsnorm, layernorm, layernorm_fp8, rmsnorm, rmsnorm_fp8
from .nvfp4 import nvfp4_amax, nvfp4_dequantize, nvfp4_quantize, nvfp4_transpose_tiles
from .rope import rope
from .softmax import (scaled_aligned_causal_masked_softmax, scaled_masked_softmax, scaled_softmax,
                      scaled_upper_triang_masked_softmax)

__all__ = ["layernorm", "rmsnorm", "add_layernorm", "add_rmsnorm", "layernorm_fp8", "rmsnorm_fp8", "fp8_quantize",
           "fp8_quantize_transpose", "fp8_quantize_current", "fp8_dequantize", "fp8_block_quantize",
           "fp8_block_dequantize", "activation", "activation_fp8", "activation_grad_fp8",
           "gelu", "qgelu", "relu", "srelu", "silu", "glu", "geglu", "qgeglu", "reglu", "sreglu",
           "swiglu", "clamped_swiglu", "rope", "multi_tensor_adam", "scaled_softmax", "scaled_masked_softmax",
           "scaled_upper_triang_masked_softmax", "scaled_aligned_causal_masked_softmax", "cross_entropy",
           "flash_attention", "flash_attention_fp8_forward", "flash_attention_fp8_backward",
           "nvfp4_amax", "nvfp4_quantize", "nvfp4_dequantize", "nvfp4_transpose_tiles", "delayed_scaling_update_"]
