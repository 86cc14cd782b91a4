"""transformer_engine.pytorch.tensor: TransformerEngine 2.x's quantizers and quantized tensors.

A quantizer (Float8Quantizer, Float8CurrentScalingQuantizer, Float8BlockQuantizer,
MXFP8Quantizer, NVFP4Quantizer; TE main's IdentityQuantizer keeps a tensor in high precision and
HybridQuantizer casts each usage with a quantizer of its own) casts a tensor to FP8 (or NVFP4) and returns the matching
QuantizedTensor (Float8Tensor, Float8BlockwiseQTensor, MXFP8Tensor, NVFP4Tensor), which reads as
its dequantised values everywhere else. te.quantized_model_init stores weights this way. The
storage names are also at TE's module paths, tensor/storage/*.
"""
from ..fp8.quantized_tensor import QuantizedTensor
from .float8_blockwise_tensor import Float8BlockQuantizer, Float8BlockwiseQTensor
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from .hybrid_tensor import HybridQuantizedTensor, HybridQuantizer
from .identity_tensor import IdentityQuantizer, IdentityTensor
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from .nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor
from .quantizer import Quantizer

# TE's *Storage classes hold quantized data without being torch.Tensors; here every quantized
# value is a QuantizedTensor, so each storage name is its tensor class, and TE code's
# isinstance(x, Float8TensorStorage) gives the same answers.
QuantizedTensorStorage = QuantizedTensor
Float8TensorStorage = Float8Tensor
MXFP8TensorStorage = MXFP8Tensor
Float8BlockwiseQTensorStorage = Float8BlockwiseQTensor
NVFP4TensorStorage = NVFP4Tensor
HybridQuantizedTensorStorage = HybridQuantizedTensor
IdentityTensorStorage = IdentityTensor

__all__ = ["QuantizedTensorStorage", "Float8TensorStorage", "MXFP8TensorStorage", "Float8BlockwiseQTensorStorage",
           "NVFP4TensorStorage", "QuantizedTensor", "Quantizer", "Float8Quantizer", "Float8CurrentScalingQuantizer", "Float8Tensor",
           "Float8BlockQuantizer", "Float8BlockwiseQTensor", "MXFP8Quantizer", "MXFP8Tensor", "NVFP4Quantizer",
           "NVFP4Tensor", "HybridQuantizer", "HybridQuantizedTensor", "HybridQuantizedTensorStorage",
           "IdentityQuantizer", "IdentityTensor", "IdentityTensorStorage"]
