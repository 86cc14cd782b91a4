"""Portable TransformerEngine: TransformerEngine's PyTorch API on CPU, CUDA and MUSA.

    import transformer_engine.pytorch as te

The distribution is named transformer-engine, as NVIDIA's is, so that the clients which look
TransformerEngine up by its distribution metadata (accelerate, Lightning, Megatron-Core) find
it; it replaces NVIDIA's package in an environment rather than sitting beside it. As NVIDIA's,
`import transformer_engine` also imports its PyTorch API: code written for TE reaches
`transformer_engine.pytorch.Linear` and `transformer_engine.common.recipe` from the top-level
module alone.
"""
from ._version import __version__
from . import common, pytorch

__all__ = ["__version__", "common", "pytorch"]
