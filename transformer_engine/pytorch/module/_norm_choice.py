"""The input normalisation of te.LayerNormLinear and te.LayerNormMLP: its parameters
(layer_norm_weight, and layer_norm_bias for LayerNorm) and its forward, in high precision or
fused with the FP8 cast of the first GEMM's input."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..custom_ops.norm import layernorm, rmsnorm
from ..parallel.attributes import mark_sequence_parallel
from ._fused_fp8 import norm_to_fp8, producer_writes_fp8
from ._fp8_call import Fp8Call

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(module: str, normalization: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{module}: normalization must be one of {', '.join(NORMALIZATIONS)}, "
                         f"got {normalization!r}")


def register_norm_parameters(module: torch.nn.Module, hidden: int, normalization: str, factory: dict) -> None:
    """layer_norm_weight [hidden] (and layer_norm_bias [hidden] for LayerNorm; RMSNorm has none)."""
    module.layer_norm_weight = torch.nn.Parameter(torch.empty(hidden, **factory))
    module.layer_norm_bias = (torch.nn.Parameter(torch.empty(hidden, **factory)) if normalization == "LayerNorm"
                              else None)


def reset_norm_parameters(module: torch.nn.Module, zero_centered_gamma: bool) -> None:
    """Weight 1 (0 when zero_centered_gamma: the output uses 1 + weight), bias 0; both marked
    with the module's sequence_parallel (a norm over token shards: see mark_sequence_parallel)."""
    with torch.no_grad():
        module.layer_norm_weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if module.layer_norm_bias is not None:
            module.layer_norm_bias.zero_()
    for param in (module.layer_norm_weight, module.layer_norm_bias):
        if param is not None:
            mark_sequence_parallel(param, module.sequence_parallel)


def normalize(x: Tensor, weight: Tensor, bias: Optional[Tensor], normalization: str, eps: float,
              zero_centered_gamma: bool, fp8: Optional[Fp8Call],
              return_output: bool) -> Tuple[Tensor, Optional[Fp8Call]]:
    """(norm(x), the call of the GEMM that consumes it) for x [tokens, hidden]. When
    producer_writes_fp8(fp8) (delayed scaling) the norm writes the FP8 input of the GEMM `fp8`
    itself: the call returned carries it, and the tensor is the high-precision output only when
    return_output (see _fused_fp8.py). Otherwise fp8 is returned as it came."""
    rms = normalization == "RMSNorm"
    if producer_writes_fp8(fp8):
        return norm_to_fp8(x, weight, bias, rms, eps, zero_centered_gamma, fp8, return_output)
    if rms:
        return rmsnorm(x, weight, eps, zero_centered_gamma), fp8
    return layernorm(x, weight, bias, eps, zero_centered_gamma), fp8
