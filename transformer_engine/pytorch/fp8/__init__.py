"""FP8 machinery: scaling math (scaling.py) as pure functions over fp32 tensors."""
from . import scaling

__all__ = ["scaling"]
