"""TE main's module path of HybridQuantizedTensorStorage (the storage classes are the tensor classes here)."""
from ..hybrid_tensor import HybridQuantizedTensor as HybridQuantizedTensorStorage

__all__ = ["HybridQuantizedTensorStorage"]
