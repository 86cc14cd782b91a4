"""transformer_engine.pytorch.cpp_extensions: the functional entry points TE code calls below the
modules (general_gemm, general_grouped_gemm, and the fused-attention backend names)."""
from .gemm import general_gemm
from .grouped_gemm import general_grouped_gemm

__all__ = ["general_gemm", "general_grouped_gemm"]
