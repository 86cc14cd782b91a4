"""transformer_engine_torch: the module TransformerEngine's C++ extension is imported as
(`import transformer_engine_torch as tex`), with the parts of its interface that code written
for TE calls directly: the dtype and FP8 slot enums, FP8TensorMeta, the multi-tensor kernels
and the fused delayed-scaling update. Each is this package's implementation (see the module
each name comes from); nothing here is a kernel of its own.
"""
import enum

import torch

from transformer_engine.pytorch.constants import DType
from transformer_engine.pytorch.fp8.scaling import compute_amax, delayed_scale, roll_amax_history
from transformer_engine.pytorch.fp8.state import ScalingGroup as FP8TensorMeta
from transformer_engine.pytorch.optimizers.multi_tensor import (multi_tensor_compute_scale_and_scale_inv,
                                                                multi_tensor_compute_scale_inv_e8m0,
                                                                multi_tensor_l2norm, multi_tensor_scale,
                                                                multi_tensor_scale_tensor,
                                                                multi_tensor_unscale_l2norm)


class FP8FwdTensors(enum.IntEnum):
    """The forward FP8 slots of a module: (input, weight, output) per GEMM."""
    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(enum.IntEnum):
    """The backward FP8 slots of a module: (grad_output, grad_input) per GEMM."""
    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


def fused_amax_and_scale_update_after_reduction(amax_reduction_buffer, amax_histories, scales,
                                                amax_compute_algo: str, fp8_dtype: DType, margin: float) -> None:
    """The delayed-scaling update of several groups after their live amaxes were reduced
    across ranks: amax_reduction_buffer holds the reduced row 0 of each history, one after
    another. Each history [len, n] takes its row 0 from the buffer, yields the amax by
    amax_compute_algo ('max' or 'most_recent') and rolls; each scale [n] becomes
    fp8_max / amax / 2**margin (kept where the amax is 0, inf or NaN). In place."""
    fp8_max = float(torch.finfo(DType(fp8_dtype).to_torch()).max)
    offset = 0
    for history, scale in zip(amax_histories, scales):
        width = history.shape[-1] if history.dim() > 1 else history.numel()
        history[0].copy_(amax_reduction_buffer[offset:offset + width].reshape(history[0].shape))
        offset += width
        amax = compute_amax(history, amax_compute_algo)
        history.copy_(roll_amax_history(history))
        scale.copy_(delayed_scale(amax.reshape(scale.shape), scale, fp8_max, margin))


__all__ = ["DType", "FP8FwdTensors", "FP8BwdTensors", "FP8TensorMeta", "fused_amax_and_scale_update_after_reduction",
           "multi_tensor_scale", "multi_tensor_scale_tensor", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm",
           "multi_tensor_compute_scale_and_scale_inv", "multi_tensor_compute_scale_inv_e8m0"]
