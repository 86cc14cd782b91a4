"""Plain-PyTorch versions of every op: the oracle for tests and benchmarks, and the
implementation on devices that have no kernel yet (build_info() says where that is)."""
from .fp8_block import fp8_block_dequantize, fp8_block_quantize
from .fp8_cast import fp8_dequantize, fp8_quantize, fp8_quantize_transpose
from .norm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .norm import (add_layernorm_bwd, add_layernorm_fwd, add_rmsnorm_bwd, add_rmsnorm_fwd, layernorm_fp8_fwd,
                   rmsnorm_fp8_fwd)

__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "fp8_quantize", "fp8_quantize_transpose",
           "fp8_dequantize", "fp8_block_quantize", "fp8_block_dequantize",
           "add_layernorm_fwd", "add_layernorm_bwd", "add_rmsnorm_fwd", "add_rmsnorm_bwd", "layernorm_fp8_fwd",
           "rmsnorm_fp8_fwd"]
