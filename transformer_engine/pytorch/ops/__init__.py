"""te.ops: TransformerEngine's fusible operations. Basic operations (basic/) are nn.Modules with
TE's arguments and parameter names; te.ops.Sequential runs adjacent ones fused onto this
package's kernels (fused/: norm -> linear with the norm writing the GEMM's FP8 input, bias ->
activation in one kernel, activation -> linear with the activation writing the FP8 input, the
bias in the GEMM epilogue). Inside te.autocast the GEMMs run in FP8 as te.Linear's do. TE's op
protocol, user fusions and named extra-tensor channels run too (docs/te_ops.md).

This package's kernels as plain functions are te.kernels."""
from . import basic, fused
from .basic import (GEGLU, GELU, GLU, QGEGLU, QGELU, AddExtraInput, AddInPlace, AllGather, AllReduce, BasicLinear,
                    Bias, ClampedSwiGLU, ConstantScale, Dropout, GroupedLinear, Identity, L2Normalization, LayerNorm,
                    Linear, MakeExtraOutput, Quantize, ReduceScatter, ReGLU, ReLU, Reshape, RMSNorm, SiLU, SReGLU,
                    SReLU, SwiGLU, ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU, SiTUGLU)
from .context import OperationContext
from .fusion_registry import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion
from .op import BasicOperation, FusedOperation, FusibleOperation
from .sequential import Sequential

__all__ = ["Sequential", "FusibleOperation", "BasicOperation", "FusedOperation", "OperationContext",
           "register_forward_fusion", "register_backward_fusion", "register_forward_backward_fusion", "basic",
           "fused", "GELU", "GEGLU", "GLU",
           "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU", "SwiGLU", "ClampedSwiGLU",
           "ScaledSwiGLU", "ScaledSReLU", "ScaledClampedQGeGLU", "SiTUGLU", "ScaledSiTUGLU", "AllGather",
           "AllReduce", "ReduceScatter", "GroupedLinear", "L2Normalization", "BasicLinear", "Bias", "Linear",
           "LayerNorm", "RMSNorm", "Quantize", "AddExtraInput", "AddInPlace", "ConstantScale", "Dropout", "Identity",
           "MakeExtraOutput", "Reshape"]
