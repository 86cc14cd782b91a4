"""te.ops's fused operations: adjacent basic ops that Sequential runs as one.

Where this package has a fused kernel the fusion uses it:
- ForwardNormLinear (LayerNorm / RMSNorm, then Linear or BasicLinear [+ Bias]): under delayed
  scaling the norm kernel writes the GEMM's FP8 input itself (norm -> FP8 in one pass), the
  bias goes into the GEMM's fp32 epilogue.
- ForwardLinearBiasActivation (BasicLinear, Bias [, activation]): the bias in the GEMM's fp32
  epilogue; the activation on its kernel.
- BackwardActivationBias (Bias, activation): the bias added inside the activation kernel, its
  gradient summed inside the backward kernel.
- ForwardActivationLinear (activation, then Linear or BasicLinear): under delayed scaling the
  activation kernel writes the GEMM's FP8 input (activation -> FP8 in one pass).
- ForwardLinearBiasAdd / ForwardLinearScaleAdd (BasicLinear [, Bias] / ConstantScale, then
  AddExtraInput): the bias in the GEMM epilogue; the scale and the add after it.
- BackwardAddRMSNorm (MakeExtraOutput, RMSNorm): the residual + RMSNorm kernel, whose backward
  adds the extra output's gradient in fp32 before rounding.
TE's backward fusions BackwardLinearAdd (MakeExtraOutput, BasicLinear) and BackwardLinearScale
(BasicLinear, ConstantScale) fuse cuBLAS epilogues (accumulate into the extra gradient, alpha)
that have no counterpart on our GEMMs: they group their ops, which run one after the other, so
that a model has TE's structure.
"""
from .ops import (BackwardActivationBias, BackwardAddRMSNorm, BackwardLinearAdd, BackwardLinearScale,
                  ForwardActivationLinear, ForwardLinearBiasActivation, ForwardLinearBiasAdd, ForwardLinearScaleAdd,
                  ForwardNormLinear)

__all__ = ["ForwardNormLinear", "ForwardLinearBiasActivation", "BackwardActivationBias", "ForwardActivationLinear",
           "ForwardLinearBiasAdd", "ForwardLinearScaleAdd", "BackwardLinearAdd", "BackwardLinearScale",
           "BackwardAddRMSNorm"]
