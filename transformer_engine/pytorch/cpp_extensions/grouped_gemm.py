"""general_grouped_gemm: TransformerEngine's grouped GEMM entry point, one general_gemm per group.

    out, bias_or_grad_bias, gelu_input = general_grouped_gemm(A, B, out, quantization_params, out_dtype,
                                                              layout="TN", m_splits=..., ...)

A, B: one operand each per group (plain or quantized tensors, general_gemm's layouts); out: one
tensor per group, or with single_output one [sum(m_splits), n] tensor whose consecutive row
blocks (m_splits) are the groups' outputs. Each group's product is general_gemm's: the same
numerics as the single GEMM (TE's tests compare the two bit for bit).
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .gemm import general_gemm


def _outputs(out: Sequence[Tensor], num_gemms: int, m_splits: Optional[Sequence[int]],
             single_output: bool) -> List[Tensor]:
    """The groups' output tensors: out itself, or views of out[0]'s row blocks."""
    if not single_output:
        if len(out) != num_gemms:
            raise ValueError(f"general_grouped_gemm: {num_gemms} groups need {num_gemms} outputs, got {len(out)}")
        return list(out)
    if m_splits is None or len(m_splits) != num_gemms:
        raise ValueError(f"general_grouped_gemm: single_output needs m_splits with one size per group ({num_gemms}), "
                         f"got {m_splits!r}")
    if sum(m_splits) != out[0].shape[0]:
        raise ValueError(f"general_grouped_gemm: m_splits sum to {sum(m_splits)} rows, the single output has "
                         f"{out[0].shape[0]}")
    return list(torch.split(out[0], list(m_splits), dim=0))


def general_grouped_gemm(A: List[Tensor], B: List[Tensor], out: List[Tensor], quantization_params: List,
                         out_dtype: Optional[torch.dtype] = None, layout: str = "TN",
                         m_splits: Optional[List[int]] = None, gelu: bool = False, grad: bool = False,
                         accumulate: bool = False, bias: Optional[List[Optional[Tensor]]] = None,
                         use_bias: bool = False, use_split_accumulator: bool = False, D_dtype=None,
                         single_output: bool = False) -> Tuple:
    """(out, the biases, or with grad the bias gradients, gelu inputs or None): out as given
    (the single tensor with single_output), each group's product written into its part.
    out_dtype: each output's own dtype is what it is rounded to (TE's rule); D_dtype is not
    supported."""
    num_gemms = len(A)
    if len(B) != num_gemms:
        raise ValueError(f"general_grouped_gemm: A has {num_gemms} operands and B {len(B)}")
    if D_dtype is not None:
        raise NotImplementedError("general_grouped_gemm: D_dtype (an output type other than out's) is not supported")
    params = list(quantization_params) if quantization_params is not None else [None] * num_gemms
    biases = list(bias) if use_bias and bias is not None else [None] * num_gemms
    outputs = _outputs(out, num_gemms, m_splits, single_output)
    bias_grads, gelu_inputs = [], []
    for i in range(num_gemms):
        result, bias_grad, gelu_input, _ = general_gemm(
            A[i], B[i], out_dtype=outputs[i].dtype, quantization_params=params[i], gelu=gelu, accumulate=accumulate,
            layout=layout, out=outputs[i], bias=biases[i], use_split_accumulator=use_split_accumulator, grad=grad)
        bias_grads.append(bias_grad)
        gelu_inputs.append(gelu_input)
    returned = out[0] if single_output else outputs
    return returned, (bias_grads if grad else biases), (gelu_inputs if gelu else None)
