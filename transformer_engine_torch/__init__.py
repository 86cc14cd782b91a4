"""transformer_engine_torch: the module TransformerEngine's C++ extension is imported as
(`import transformer_engine_torch as tex`), with the parts of its interface that code written
for TE calls directly: the dtype and FP8 slot enums, FP8TensorMeta, the multi-tensor kernels,
the fused delayed-scaling update, quantize (also of several tensors, or of a tensor's row
sections) and generic_gemm. Each is this package's implementation (see the module
each name comes from); nothing here is a kernel of its own.
"""
import torch

from transformer_engine.pytorch.constants import DType, TE_DType_To_Torch
from transformer_engine.pytorch.cpp_extensions.gemm import general_gemm
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


def multi_tensor_quantize(tensor_list, quantizer_list):
    """Each tensor cast by its quantizer: a list of new quantized tensors."""
    if len(tensor_list) != len(quantizer_list):
        raise ValueError(f"multi_tensor_quantize: {len(tensor_list)} tensors and {len(quantizer_list)} quantizers")
    return [quantizer.quantize(tensor) for tensor, quantizer in zip(tensor_list, quantizer_list)]


def split_quantize(tensor: torch.Tensor, split_sections, quantizer_list, disable_bulk_allocation: bool = False):
    """tensor's consecutive sections along its first dimension (split_sections: their sizes),
    each cast by its quantizer: a list of new quantized tensors (bulk allocation is TE's memory
    layout, nothing to choose here)."""
    if sum(split_sections) != tensor.shape[0]:
        raise ValueError(f"split_quantize: split_sections {list(split_sections)} sum to {sum(split_sections)}, the "
                         f"tensor's first dimension is {tensor.shape[0]}")
    return multi_tensor_quantize(list(torch.split(tensor, list(split_sections), dim=0)), quantizer_list)


def generic_gemm(A, transa: bool, B, transb: bool, D, quantizer, output_dtype, bias, bias_type, gelu: bool,
                 gelu_in, grad: bool, workspace, workspace_size: int, accumulate: bool, use_split_accumulator: bool,
                 comm_overlap=None, comm_type=None, extra_output=None, bulk_overlap: bool = False,
                 alpha: float = 1.0, beta=None):
    """TE's C++ GEMM binding, in its argument order: general_gemm(A, B, ...) with the layout
    from transa / transb ('T' or 'N' each; TN, NN and NT) and output_dtype a te.DType. The
    workspace and bias_type are not needed here. Returns (out, bias_grad, gelu_input,
    extra_output)."""
    layout = ("T" if transa else "N") + ("T" if transb else "N")
    out_dtype = TE_DType_To_Torch[output_dtype] if output_dtype is not None else None
    return general_gemm(A, B, out_dtype=out_dtype, quantization_params=quantizer, gelu=gelu, gelu_in=gelu_in,
                        alpha=alpha, beta=beta, accumulate=accumulate, layout=layout, out=D, bias=bias,
                        use_split_accumulator=use_split_accumulator, grad=grad, ub=comm_overlap, ub_type=comm_type,
                        extra_output=extra_output, bulk_overlap=bulk_overlap)


__all__ = ["DType", "generic_gemm", "multi_tensor_quantize", "split_quantize",
           "FP8FwdTensors", "FP8BwdTensors", "FP8TensorMeta", "fused_amax_and_scale_update_after_reduction",
           "multi_tensor_scale", "multi_tensor_scale_tensor", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm",
           "multi_tensor_compute_scale_and_scale_inv", "multi_tensor_compute_scale_inv_e8m0", "quantize"]
