"""general_gemm: TransformerEngine's one GEMM entry point, in cuBLAS's column-major terms.

    out, bias_grad, gelu_input, extra_output = general_gemm(A, B, out_dtype, layout="TN", ...)

layout "TN": out = B @ A^T (A the weight [n, k], B the input [m, k]: the forward GEMM);
"NN": out = B @ A (A [n, k], B [m, n]: dgrad); "NT": out = B^T @ A (A [m, k], B [m, n]:
wgrad); "TT": out = B^T @ A^T. (In row-major terms out = op(B) @ op(A), the first letter
transposing A, the second B.) A and B are plain tensors or quantized tensors
(transformer_engine.pytorch.tensor);
two quantized operands multiply their FP8 codes (fp8/gemm.py: fp32 sums, scales and bias
applied once in fp32, one rounding), anything else runs in fp32 and is rounded once.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..fp8.block_tensor import Float8BlockPair
from ..fp8.codes import Float8Codes
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.gemm import fp8_gemm

_LAYOUTS = ("TN", "NN", "NT", "TT")


def _operand(x: QuantizedTensor, transpose: bool):
    """x's FP8 operand as a matrix with the contracted dimension last."""
    operand = x._storage.operand
    if isinstance(operand, Float8Codes) and operand.data.dim() != 2:
        operand = Float8Codes(operand.data.reshape(-1, operand.data.shape[-1]), operand.scale_inv)
    if not transpose:
        return operand
    if isinstance(operand, Float8BlockPair) and operand.columnwise is None:
        raise ValueError("general_gemm: a block-scaled operand used transposed needs its column-wise usage "
                         "(quantize it with columnwise=True)")
    return operand.t()


def _matrix(x: Tensor) -> Tensor:
    plain = x.dequantize(torch.float32) if isinstance(x, QuantizedTensor) else x.float()
    return plain.reshape(-1, plain.shape[-1])  # [prod(shape[:-1]), shape[-1]]


def general_gemm(A: Tensor, B: Tensor, out_dtype: Optional[torch.dtype] = None, quantization_params=None,
                 gelu: bool = False, gelu_in: Optional[Tensor] = None, alpha: float = 1.0,
                 beta: Optional[float] = None, accumulate: bool = False, layout: str = "TN",
                 out: Optional[Tensor] = None, bias: Optional[Tensor] = None, use_split_accumulator: bool = False,
                 grad: bool = False, ub=None, ub_type=None, extra_output: Optional[Tensor] = None,
                 bulk_overlap: bool = False, *,
                 workspace: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(out, bias_grad, gelu_input, extra_output); see the module docstring for the layouts.
    bias: added to the product (grad=False), or, with grad=True, bias_grad = the column sums of
    B. gelu: out = gelu(product), gelu_input the product. accumulate: out := beta * out +
    alpha * product (beta defaults to 1). quantization_params: a quantizer out is cast with.
    use_split_accumulator changes nothing here (sums are always fp32). workspace: the cuBLAS
    workspace TE up to 2.8 took (callers that find module.base.get_workspace, as Megatron-Core's
    te_general_gemm, pass it); these GEMMs need none."""
    if layout not in _LAYOUTS:
        raise ValueError(f"general_gemm: layout must be one of {_LAYOUTS}, got {layout!r}")
    if ub is not None or ub_type is not None:
        raise NotImplementedError("general_gemm: userbuffers communication overlap is not implemented")
    transa, transb = layout[0] == "T", layout[1] == "T"
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else (torch.float32 if isinstance(A, QuantizedTensor) else A.dtype)
    bias_in_product = bias is not None and not grad and not gelu
    if isinstance(A, QuantizedTensor) and isinstance(B, QuantizedTensor):
        # out = op(B) @ op(A): as fp8_gemm's a @ b^T, a = op(B), b = op(A)^T.
        product = fp8_gemm(_operand(B, transpose=transb), _operand(A, transpose=not transa), torch.float32,
                           bias.float() if bias_in_product else None)
    else:
        a, b = _matrix(A), _matrix(B)
        product = (b.t() if transb else b) @ (a.t() if transa else a)
        if bias_in_product:
            product = product + bias.float()
    gelu_input = None
    if gelu:
        if bias is not None and not grad:
            product = product + bias.float()
        gelu_input = product.to(out_dtype)
        product = torch.nn.functional.gelu(product, approximate="tanh")
    if accumulate:
        if out is None:
            raise ValueError("general_gemm: accumulate=True needs `out`")
        product = alpha * product + (1.0 if beta is None else beta) * out.float()
    elif alpha != 1.0:
        product = alpha * product
    bias_grad = _matrix(B).sum(dim=0).to(bias.dtype) if bias is not None and grad else None
    if quantization_params is not None:
        result = quantization_params(product.to(out_dtype))
    else:
        result = product.to(out_dtype)
    if out is not None and not isinstance(out, QuantizedTensor):
        if tuple(out.shape) != tuple(result.shape):
            raise ValueError(f"general_gemm: out has shape {tuple(out.shape)}, the product {tuple(result.shape)}")
        out.copy_(result)
        result = out
    return result, bias_grad, gelu_input, extra_output
