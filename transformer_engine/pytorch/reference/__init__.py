"""Plain-PyTorch versions of every op: the oracle for tests and benchmarks, and the
implementation on devices that have no kernel yet (build_info() says where that is)."""
from .activation import activation_bwd, activation_bwd_dbias, activation_bwd_fp8, activation_fp8, activation_fwd
from .adam import adam_step
from .attention import flash_attention_bwd, flash_attention_fwd
from .attention_fp8 import flash_attention_fp8_bwd, flash_attention_fp8_fwd
from .delayed_scaling import delayed_scaling_update_
from .cross_entropy import cross_entropy_bwd, cross_entropy_fwd, cross_entropy_partials, cross_entropy_sharded_grad
from .fp8_block import fp8_block_dequantize, fp8_block_quantize
from .fp8_cast import (fp8_dequantize, fp8_quantize, fp8_quantize_current, fp8_quantize_delayed_,
                       fp8_quantize_transpose, fp8_transpose)
from .norm import (add_layernorm_bwd, add_layernorm_fwd, add_rmsnorm_bwd, add_rmsnorm_fwd, layernorm_bwd,
                   layernorm_fp8_fwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fp8_fwd, rmsnorm_fwd)
from .nvfp4 import nvfp4_amax, nvfp4_dequantize, nvfp4_quantize, nvfp4_transpose_tiles
from .rope import rope_bwd, rope_fwd
from .scaled_gemm import fp8_block_gemm, scaled_gemm, scaled_gemm_accumulate
from .softmax import scaled_softmax_bwd, scaled_softmax_fwd

__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "add_layernorm_fwd", "add_layernorm_bwd",
           "add_rmsnorm_fwd", "add_rmsnorm_bwd", "layernorm_fp8_fwd", "rmsnorm_fp8_fwd", "fp8_quantize",
           "fp8_quantize_transpose", "fp8_quantize_current", "fp8_quantize_delayed_", "fp8_dequantize", "fp8_transpose",
           "fp8_block_quantize", "fp8_block_dequantize", "delayed_scaling_update_", "activation_fwd", "activation_bwd",
           "activation_bwd_dbias", "activation_fp8", "activation_bwd_fp8", "rope_fwd", "rope_bwd", "adam_step",
           "scaled_softmax_fwd", "scaled_softmax_bwd", "cross_entropy_fwd", "cross_entropy_bwd", "scaled_gemm",
           "scaled_gemm_accumulate", "fp8_block_gemm", "cross_entropy_partials", "cross_entropy_sharded_grad",
           "flash_attention_fwd", "flash_attention_bwd", "flash_attention_fp8_fwd", "flash_attention_fp8_bwd",
           "nvfp4_amax", "nvfp4_quantize", "nvfp4_dequantize", "nvfp4_transpose_tiles"]
