"""Plain-PyTorch versions of every op: the oracle for tests and benchmarks, and the
implementation on devices that have no kernel yet (build_info() says where that is)."""
from .fp8_block import fp8_block_dequantize, fp8_block_quantize
from .fp8_cast import fp8_dequantize, fp8_quantize, fp8_quantize_transpose
from .norm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .rope import rope_bwd, rope_fwd
from .adam import adam_step

__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "fp8_quantize", "fp8_quantize_transpose",
           "fp8_dequantize", "fp8_block_quantize", "fp8_block_dequantize", "rope_fwd", "rope_bwd", "adam_step"]
