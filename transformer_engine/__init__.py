"""Portable TransformerEngine: TransformerEngine's PyTorch API on CPU, CUDA and MUSA.

    import transformer_engine.pytorch as te
"""
__version__ = "0.1.0"
