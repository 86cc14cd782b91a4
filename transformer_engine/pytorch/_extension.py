"""Loads the compiled extension. Importing it registers every op under torch.ops.portable_te
(schemas and CPU kernels); the module object itself only carries build facts."""
from transformer_engine import _kernels as kernels

NAMESPACE = "portable_te"

__all__ = ["kernels", "NAMESPACE"]
