"""Portable TransformerEngine: TransformerEngine's PyTorch API on CPU, CUDA and MUSA.

    import transformer_engine.pytorch as te

The distribution is named transformer-engine, as NVIDIA's is, so that the clients which look
TransformerEngine up by its distribution metadata (accelerate, Lightning, Megatron-Core) find
it; it replaces NVIDIA's package in an environment rather than sitting beside it.
"""
from ._version import __version__

__all__ = ["__version__"]
