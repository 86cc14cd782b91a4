"""TE 2.18's name of custom_recipes.reference_nvfp4 (TE main's), re-exported."""
from .reference_nvfp4 import NVFP4QuantizerRef, NVFP4TensorRef, nvfp4_ref_rht_2d_quantizer_factory

__all__ = ["NVFP4QuantizerRef", "NVFP4TensorRef", "nvfp4_ref_rht_2d_quantizer_factory"]
