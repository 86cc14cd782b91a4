"""TE's module path of MXFP8TensorStorage (tensor/__init__.py)."""
from .. import MXFP8TensorStorage

__all__ = ["MXFP8TensorStorage"]
