"""Framework-independent parts of TransformerEngine's API: the FP8 recipes."""
from . import recipe

__all__ = ["recipe"]
