"""TE's module path of Float8TensorStorage (tensor/__init__.py)."""
from .. import Float8TensorStorage

__all__ = ["Float8TensorStorage"]
