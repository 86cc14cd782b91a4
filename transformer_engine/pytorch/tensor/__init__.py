"""transformer_engine.pytorch.tensor: TransformerEngine 2.x's home of QuantizedTensor, the
FP8-stored parameter type (made by te.quantized_model_init; see fp8/quantized_tensor.py)."""
from ..fp8.quantized_tensor import QuantizedTensor

__all__ = ["QuantizedTensor"]
