"""Plain-PyTorch versions of every op: the oracle for tests and benchmarks, and the
implementation on devices that have no kernel yet (build_info() says where that is)."""
from .norm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd"]
