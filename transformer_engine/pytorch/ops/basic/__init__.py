"""te.ops's basic operations."""
from .activation import (GEGLU, GELU, GLU, QGEGLU, QGELU, ClampedSwiGLU, ReGLU, ReLU, ScaledClampedQGeGLU,
                         ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU, SiLU, SiTUGLU, SReGLU, SReLU, SwiGLU)
from .communication import AllGather, AllReduce, ReduceScatter
from .grouped_linear import GroupedLinear
from .l2normalization import L2Normalization
from .linear import BasicLinear, Bias, Linear
from .norm import LayerNorm, RMSNorm
from .quantize import Quantize
from .tensor_ops import AddExtraInput, AddInPlace, ConstantScale, Dropout, Identity, MakeExtraOutput, Reshape

__all__ = ["GELU", "GEGLU", "GLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU", "SwiGLU",
           "ClampedSwiGLU", "ScaledSwiGLU", "ScaledSReLU", "ScaledClampedQGeGLU", "SiTUGLU", "ScaledSiTUGLU",
           "AllGather", "AllReduce",
           "ReduceScatter", "GroupedLinear", "L2Normalization",
           "BasicLinear", "Bias", "Linear", "LayerNorm", "RMSNorm", "Quantize", "AddExtraInput", "AddInPlace",
           "ConstantScale", "Dropout", "Identity", "MakeExtraOutput", "Reshape"]
