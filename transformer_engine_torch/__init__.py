"""transformer_engine_torch: the module TransformerEngine's C++ extension is imported as
(`import transformer_engine_torch as tex`), with the parts of its interface that code written
for TE calls directly: the dtype and FP8 slot enums, FP8TensorMeta, the multi-tensor kernels,
the fused delayed-scaling update and quantize. Each is this package's implementation (see the module
each name comes from); nothing here is a kernel of its own.
"""
import torch

from transformer_engine.pytorch.constants import DType
from transformer_engine.pytorch.constants import FP8BwdTensorIdx as FP8BwdTensors, FP8FwdTensorIdx as FP8FwdTensors
from transformer_engine.pytorch.scaling import compute_amax, delayed_scale, roll_amax_history
from transformer_engine.pytorch.fp8.state import ScalingGroup as FP8TensorMeta
from transformer_engine.pytorch.optimizers.multi_tensor import (multi_tensor_compute_scale_and_scale_inv,
                                                                multi_tensor_compute_scale_inv_e8m0,
                                                                multi_tensor_l2norm, multi_tensor_scale,
                                                                multi_tensor_scale_tensor,
                                                                multi_tensor_unscale_l2norm)


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


def quantize(tensor: torch.Tensor, quantizer, output=None, noop_flag=None):
    """tensor cast by `quantizer` (a transformer_engine.pytorch.tensor quantizer): a new
    quantized tensor, or written into `output` (left as it was where the one-element
    noop_flag holds 1)."""
    if output is None:
        return quantizer.quantize(tensor)
    return quantizer.update_quantized(tensor, output, noop_flag=noop_flag)


__all__ = ["DType", "FP8FwdTensors", "FP8BwdTensors", "FP8TensorMeta", "fused_amax_and_scale_update_after_reduction",
           "multi_tensor_scale", "multi_tensor_scale_tensor", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm",
           "multi_tensor_compute_scale_and_scale_inv", "multi_tensor_compute_scale_inv_e8m0", "quantize"]
