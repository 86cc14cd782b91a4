"""TE's module path of NVFP4TensorStorage (tensor/__init__.py)."""
from .. import NVFP4TensorStorage

__all__ = ["NVFP4TensorStorage"]
