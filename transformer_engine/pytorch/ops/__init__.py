"""Op wrappers: one file per op family over torch.ops.portable_te."""
from .norm import layernorm, rmsnorm

__all__ = ["layernorm", "rmsnorm"]
