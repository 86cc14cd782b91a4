"""TE's module path of Float8BlockwiseQTensorStorage (tensor/__init__.py)."""
from .. import Float8BlockwiseQTensorStorage

__all__ = ["Float8BlockwiseQTensorStorage"]
