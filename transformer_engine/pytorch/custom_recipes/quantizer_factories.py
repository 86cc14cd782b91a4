"""TE main's names for the factories that make CustomRecipe(qfactory=...) cast as a built-in
recipe does (quantization_recipes_base.py holds them under TE 2.18's names), and
high_precision_factory, which leaves every tensor in high precision (IdentityQuantizer): the
GEMMs then equal those of no recipe at all, bit for bit.

    recipe = CustomRecipe(qfactory=mxfp8_factory)
"""
from typing import Optional

from ..quantization import QuantizerRole
from ..tensor.identity_tensor import IdentityQuantizer
from .quantization_recipes_base import current_scaling_quantizer_factory as current_scaling_factory
from .quantization_recipes_base import delayed_scaling_quantizer_factory as delayed_scaling_factory
from .quantization_recipes_base import float8_block_scaling_quantizer_factory as float8_block_scaling_factory
from .quantization_recipes_base import mxfp8_quantizer_factory as mxfp8_factory
from .quantization_recipes_base import nvfp4_quantizer_factory as nvfp4_factory


def high_precision_factory(role: Optional[QuantizerRole]) -> IdentityQuantizer:
    """Every slot unquantized: the start to quantize a few chosen roles from."""
    return IdentityQuantizer()


__all__ = ["high_precision_factory", "delayed_scaling_factory", "current_scaling_factory",
           "float8_block_scaling_factory", "mxfp8_factory", "nvfp4_factory"]
