"""The forms a GEMM module hands its results on in, besides plain tensors: TE's fp8_output and
fp8_grad (te.Linear, te.LayerNormLinear), and the caller's preallocated buffers of
te.GroupedLinear (out=, dgrad_out=).

fp8_output / fp8_grad, inside an enabled te.autocast only (TE: `fp8_output and self.fp8`):
the GEMM's output is returned as this package's FP8 tensor (a QuantizedTensor: Float8Tensor
for the per-tensor recipes, the block recipes' own tensors), cast by the module's output
slot (forward slot 2 of the GEMM's (input, weight, output) triple); the gradient of the GEMM's
input by its grad-input slot (backward slot 1 of (grad_output, grad_input)), before the
backward's scaling update reads that slot. Each slot records its amax as any cast does. Only
the row-wise layout is made, as TE's quantizers are set for these casts.

Numerics, as TE's GEMM (transformer_engine/pytorch/csrc/extensions/gemm.cpp): where the
cast's scale is known before the data (delayed scaling) and an operand is per-tensor FP8,
cuBLAS casts its fp32 sums (bias added in fp32) to FP8 in its epilogue and records their
amax; here the GEMM writes fp32 and the cast follows, once. Every other cast (current
scaling, which needs the result's amax first; the block recipes' scales) follows a GEMM that
wrote the activation dtype (TE's "unfused quantization"), so a 16-bit module's result is
rounded to it first, as in TE.
"""
import dataclasses
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..constants import FP8BwdTensorIdx, FP8FwdTensorIdx
from ..fp8.codes import Float8Codes
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta
from ..tensor.float8_tensor import Float8Quantizer
from ..tensor.for_recipe import slot_quantizer
from ..tensor.quantizer import Quantizer
from ._fp8_call import Fp8Call


def with_fp8_forms(owner: str, call: Fp8Call, meta: Fp8Meta, fp8_output: bool, fp8_grad: bool,
                   parallel_mode: Optional[str], tp_size: int) -> Fp8Call:
    """The FP8 call of a one-GEMM module with its output quantizer (fp8_output) and its input
    gradient's (fp8_grad, when the forward prepares a backward), each row-wise only."""
    if not (fp8_output or fp8_grad):
        return call
    if tp_size > 1:
        _check_not_summed(owner, fp8_output, fp8_grad, parallel_mode, tp_size)
    output = grad_input = None
    if fp8_output:
        output = slot_quantizer(call.recipe, meta, FORWARD, FP8FwdTensorIdx.GEMM1_OUTPUT, columnwise=False)
    if fp8_grad and call.needs_backward:
        grad_input = slot_quantizer(call.recipe, meta, BACKWARD, FP8BwdTensorIdx.GRAD_INPUT1, columnwise=False)
    quantizers = call.quantizers._replace(output=output, grad_input=grad_input)
    return dataclasses.replace(call, quantizers=quantizers)


def _check_not_summed(owner: str, fp8_output: bool, fp8_grad: bool, parallel_mode: Optional[str],
                      tp_size: int) -> None:
    """Refuses the FP8 form of a result that is the ranks' sum: the output of a row-parallel
    GEMM, the input gradient of a column-parallel one (TE's GEMM would cast each rank's
    partial result, whose FP8 codes cannot be summed)."""
    summed = {"row": ("fp8_output", fp8_output, "output"), "column": ("fp8_grad", fp8_grad, "input gradient")}
    keyword, asked, result = summed.get(parallel_mode, (None, False, None))
    if asked:
        raise ValueError(f"{owner}: {keyword}=True with parallel_mode={parallel_mode!r} over tp_size={tp_size} ranks: "
                         f"the {result} is the ranks' sum, which FP8 codes cannot hold (TE would cast each rank's "
                         f"partial result)")


def written_dtype(quantizer: Optional[Quantizer], a, b, dtype: torch.dtype) -> torch.dtype:
    """The dtype an FP8 GEMM of operands a and b writes when `quantizer` (None: no cast) casts
    its result: fp32 where TE's GEMM casts in its epilogue (a delayed-scaling quantizer and a
    per-tensor operand: see the module docstring), else the activation dtype `dtype`."""
    if isinstance(quantizer, Float8Quantizer) and (isinstance(a, Float8Codes) or isinstance(b, Float8Codes)):
        return torch.float32
    return dtype


def fp8_form(quantizer: Optional[Quantizer], values: Tensor, dtype: torch.dtype) -> Tensor:
    """values cast by `quantizer` into a QuantizedTensor of nominal dtype `dtype` (the
    activation dtype, whatever the GEMM wrote), its amax recorded by the quantizer; values
    themselves without one."""
    if quantizer is None:
        return values
    return quantizer.quantize(values, dtype=dtype)


def check_buffer(owner: str, name: str, buffer: Optional[Tensor], shape: Tuple[int, int], like: Tensor) -> None:
    """A caller's preallocated result (TE's checks): a contiguous 2-D tensor of `shape`, in
    the dtype and on the device of `like` (the GEMM's input, in the activation dtype), not
    requiring grad (the result computed into it carries the history instead). None passes."""
    if buffer is None:
        return
    if not isinstance(buffer, Tensor):
        raise ValueError(f"{owner}: {name} must be a torch.Tensor of shape {tuple(shape)}, got {type(buffer).__name__}")
    problems = []
    if tuple(buffer.shape) != tuple(shape):
        problems.append(f"has shape {tuple(buffer.shape)}, expected {tuple(shape)} (tokens, features)")
    if buffer.dtype != like.dtype:
        problems.append(f"has dtype {buffer.dtype}, expected the input's (activation) dtype {like.dtype}")
    if buffer.device != like.device:
        problems.append(f"is on {buffer.device}, the input on {like.device}")
    if not problems and not buffer.is_contiguous():
        problems.append("is not contiguous")
    if buffer.requires_grad:
        problems.append("requires grad (pass buffer.detach())")
    if problems:
        raise ValueError(f"{owner}: {name} " + "; ".join(problems))


def into_buffer(parts, buffer: Optional[Tensor]) -> Tensor:
    """The row blocks `parts` stacked, into `buffer` when given: then a view of it, so that
    autograd's history goes on the result and not on the caller's tensor, which stays a plain
    buffer for its next use."""
    if buffer is None:
        return torch.cat(parts)
    torch.cat(parts, out=buffer)
    return buffer.view(buffer.shape)
