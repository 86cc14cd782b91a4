"""TransformerEngine's PyTorch API (transformer_engine.pytorch), portable to CPU, CUDA and MUSA.

    import transformer_engine.pytorch as te
    norm = te.LayerNorm(4096)
"""
from . import attention, cross_entropy, custom_ops, fp8, ops, optimizers
from .attention import DotProductAttention, MultiheadAttention, RotaryPositionEmbedding
from .attention.inference import InferenceParams
from .build_info import build_info, format_build_info
from .cross_entropy import parallel_cross_entropy
from .distributed import CudaRNGStatesTracker, checkpoint
from .fp8 import (QuantizedTensor, autocast, fp8_autocast, fp8_model_init, get_default_recipe, is_bf16_available,
                  is_fp8_available, is_fp8_block_scaling_available, is_mxfp8_available, is_nvfp4_available,
                  quantized_model_init)
from .module import (Fp8Padding, Fp8Unpadding, GroupedLinear, LayerNorm, LayerNormLinear, LayerNormMLP, Linear,
                     RMSNorm)
from .transformer import TransformerLayer
from .convert import convert_model
from .cpu_offload import get_cpu_offload_context
from .graph import make_graphed_callables
from .constants import DType
from .moe.permutation import (moe_permute, moe_permute_and_pad_with_probs, moe_permute_with_probs,
                          moe_sort_chunks_by_index, moe_sort_chunks_by_index_with_probs, moe_unpermute)
from .utils import (deinterleave_glu_tensor, default_device, get_cudnn_version, get_device_compute_capability,
                    interleave_glu_tensor)
from .torch_version import torch_version
from .tensor import (Float8BlockQuantizer, Float8BlockwiseQTensor, Float8BlockwiseQTensorStorage,
                     Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor, Float8TensorStorage, MXFP8Quantizer,
                     MXFP8Tensor, MXFP8TensorStorage, NVFP4Quantizer, NVFP4Tensor, NVFP4TensorStorage, Quantizer,
                     QuantizedTensorStorage, HybridQuantizer, HybridQuantizedTensor, HybridQuantizedTensorStorage,
                     IdentityQuantizer)
from .quantization import QuantizerRole

# te.kernels: the public name of our kernels as functions (te.kernels.gelu, ...); the package is
# custom_ops/, the dispatcher ops with their fake kernels and autograd rules.
kernels = custom_ops

__all__ = ["InferenceParams", "Quantizer", "QuantizerRole", "Float8Quantizer", "Float8CurrentScalingQuantizer",
           "Float8BlockQuantizer", "MXFP8Quantizer", "NVFP4Quantizer", "Float8Tensor", "Float8BlockwiseQTensor",
           "MXFP8Tensor", "NVFP4Tensor", "DType", "get_device_compute_capability", "moe_permute",
           "moe_permute_with_probs", "moe_permute_and_pad_with_probs", "moe_unpermute", "moe_sort_chunks_by_index",
           "moe_sort_chunks_by_index_with_probs", "LayerNorm", "Linear", "RMSNorm",
           "LayerNormLinear", "LayerNormMLP", "GroupedLinear", "Fp8Padding",
           "Fp8Unpadding", "DotProductAttention", "MultiheadAttention", "TransformerLayer", "build_info",
           "format_build_info", "default_device", "fp8", "kernels", "custom_ops", "ops", "autocast", "fp8_autocast", "get_default_recipe",
           "is_fp8_available", "is_mxfp8_available", "is_fp8_block_scaling_available", "is_nvfp4_available",
           "is_bf16_available", "quantized_model_init", "fp8_model_init", "QuantizedTensor",
           "attention", "optimizers", "RotaryPositionEmbedding", "cross_entropy", "parallel_cross_entropy",
           "checkpoint", "convert_model", "get_cpu_offload_context", "make_graphed_callables", "CudaRNGStatesTracker", "torch_version", "get_cudnn_version",
           "interleave_glu_tensor", "deinterleave_glu_tensor", "QuantizedTensorStorage", "Float8TensorStorage",
           "MXFP8TensorStorage", "Float8BlockwiseQTensorStorage", "NVFP4TensorStorage", "HybridQuantizer",
           "HybridQuantizedTensor", "HybridQuantizedTensorStorage", "IdentityQuantizer"]
