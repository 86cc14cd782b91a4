"""TE 2.18's name of custom_recipes.reference_utils (its module of that name, re-exported)."""
from .reference_utils import HIGH_PRECISION_FLOAT_DTYPES, Fp4Formats, roundup_div

__all__ = ["HIGH_PRECISION_FLOAT_DTYPES", "Fp4Formats", "roundup_div"]
