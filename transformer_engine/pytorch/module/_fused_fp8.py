"""Producers that write a GEMM's FP8 input directly (delayed scaling: the scale is known
before the data): norm -> FP8 and activation -> FP8, each in one kernel pass that also
gives the amax. The codes are bit for bit those of fp8_quantize of the high-precision
result, so a module gets the same numbers as when it casts a high-precision output.

The activation's backward also writes the gradient of its input as the FP8 operand of the GEMM
before it (activation_grad_fp8: codes, their transpose and amax in one pass, the high-precision
gradient never written), where that GEMM's backward takes it so (grad_operand_quantizer): the
gradient then travels to it as a Float8Tensor, which its backward consumes as it is.

Each producer returns the tensor the gradient arrives on (the high-precision output when it
is asked for, return_layernorm_output, else a zero-stride stand-in of the output's shape and
dtype: no memory, the values exist only as FP8 codes) and the consuming GEMM's Fp8Call with
the FP8 operand as its input_fp8, a new call: nothing is written into the caller's. The
autograd functions return the codes as non-differentiable outputs. The backward is the plain
op's, from the statistics (norm) or the input (activation).
"""
import dataclasses
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._extension import NAMESPACE
from ..fp8.codes import Float8Codes
from ..custom_ops.activation import activation_fp8, activation_grad_fp8
from ..tensor.float8_tensor import Float8Quantizer
from ..fp8.quantized_tensor import QuantizedTensor
from ..custom_ops.norm import layernorm_fp8, rmsnorm_fp8
from ._fp8_call import Fp8Call

_ops = getattr(torch.ops, NAMESPACE)


def producer_writes_fp8(fp8: Optional[Fp8Call]) -> bool:
    """Whether the producer feeding the GEMM `fp8` writes its FP8 input: under delayed
    scaling, except while torch.compile traces. Dynamo cannot trace the GEMM's backward when
    its FP8 input is another autograd function's output (the transposed codes made from it
    alias that output, and torch 2.13 refuses them), so there the GEMM casts the
    high-precision output itself, to the same codes."""
    return fp8 is not None and fp8.recipe.delayed() and not torch.compiler.is_compiling()


def _stand_in(like: Tensor, shape) -> Tensor:
    return like.new_zeros((), dtype=like.dtype).expand(shape)


def _input_scale(fp8: Fp8Call) -> Tensor:
    """A copy of the scale the GEMM's input quantizer casts with, float32 [1] (the kernel's
    argument; the slot itself may be updated before the codes are used)."""
    return fp8.quantizers.input.scale.clone()


def _norm_fp8(x: Tensor, weight: Tensor, bias: Optional[Tensor], rms: bool, eps: float, zero_centered_gamma: bool,
              fp8: Fp8Call, return_output: bool):
    """The norm of x into the GEMM's FP8 input, its amax recorded: (output or None, codes,
    scale_inv, mean or None, rstd)."""
    scale = _input_scale(fp8)
    fp8_dtype = fp8.quantizers.input.fp8_dtype
    if rms:
        data, amax, rstd, output = rmsnorm_fp8(x, weight, scale, fp8_dtype, eps, zero_centered_gamma, return_output)
        mean = None
    else:
        data, amax, mean, rstd, output = layernorm_fp8(x, weight, bias, scale, fp8_dtype, eps, zero_centered_gamma,
                                                       return_output)
    fp8.quantizers.input.record_amax(amax)
    return output, data, torch.reciprocal(scale.float()), mean, rstd


def _activation_fp8(h: Tensor, activation: str, limit: float, alpha: float, fp8: Fp8Call) -> Tuple[Tensor, Tensor]:
    """activation(h) into the GEMM's FP8 input, its amax recorded: (codes, scale_inv)."""
    scale = _input_scale(fp8)
    data, amax = activation_fp8(h, activation, scale, fp8.quantizers.input.fp8_dtype, None, limit, alpha)
    fp8.quantizers.input.record_amax(amax)
    return data, torch.reciprocal(scale.float())


class NormToFp8(torch.autograd.Function):
    """LayerNorm (bias given) or RMSNorm (bias None) of x [tokens, hidden] into the FP8 input
    of the GEMM `fp8`. Returns the normalised x [tokens, hidden] when return_output, else
    the stand-in."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], rms: bool, eps: float,
                zero_centered_gamma: bool, fp8: Fp8Call, return_output: bool):
        output, data, scale_inv, mean, rstd = _norm_fp8(x, weight, bias, rms, eps, zero_centered_gamma, fp8,
                                                        return_output)
        ctx.rms, ctx.zero_centered_gamma, ctx.has_bias = rms, zero_centered_gamma, bias is not None
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.mark_non_differentiable(data, scale_inv)
        ctx.set_materialize_grads(False)  # the codes' gradients stay None, not zeros of their size
        return (output if return_output else _stand_in(x, x.shape)), data, scale_inv

    @staticmethod
    def backward(ctx, grad_output: Optional[Tensor], _grad_data, _grad_scale_inv):
        if grad_output is None:  # the output took no part in the loss
            return (None,) * 8
        x, weight, mean, rstd = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        if ctx.rms:
            grad_x, grad_weight = _ops.rmsnorm_bwd(grad_output, x, rstd, weight, ctx.zero_centered_gamma)
            grad_bias = None
        else:
            grad_x, grad_weight, grad_bias = _ops.layernorm_bwd(grad_output, x, mean, rstd, weight,
                                                                ctx.zero_centered_gamma)
        return grad_x, grad_weight, grad_bias if ctx.has_bias else None, None, None, None, None, None


def grad_operand_quantizer(producer: Optional[Fp8Call], bias: Optional[Tensor]) -> Optional[Float8Quantizer]:
    """The quantizer with which the backward of the GEMM `producer` (the one whose output the
    activation reads) casts its output's gradient, where that backward can take the gradient as
    FP8 codes written by the activation's backward instead: delayed scaling (the scale is known
    before the data), the FP8 backward GEMMs (no backward_override), no bias (its gradient is
    the sum of the high-precision gradient, which the codes do not keep); else None."""
    if producer is None or not producer.needs_backward or bias is not None or not producer_writes_fp8(producer):
        return None
    quantizer = producer.quantizers.grad_output
    return quantizer if producer.recipe.backward_override is None and isinstance(quantizer, Float8Quantizer) else None


def _grad_as_fp8(grad_output: Tensor, h: Tensor, args: Tuple[str, float, float],
                 quantizer: Float8Quantizer) -> QuantizedTensor:
    """The activation's input gradient for grad_output as `quantizer` would cast it (codes, the
    transpose where it keeps the column-wise usage, the amax recorded), as a Float8Tensor of h's
    shape and dtype: activation_grad_fp8's one pass."""
    activation, limit, alpha = args
    scale = quantizer.scale.to(h.device).reshape(1).float()
    data, data_t, amax = activation_grad_fp8(grad_output, h, activation, scale, quantizer.fp8_dtype,
                                             quantizer.columnwise_usage and h.dim() == 2, limit, alpha)
    quantizer.record_amax(amax.reshape(1))
    scale_inv = torch.reciprocal(scale)  # as Float8Codes.quantize computes it
    codes = Float8Codes(data, scale_inv, None if data_t is None else Float8Codes(data_t, scale_inv))
    return quantizer.tensor_of(codes, h.shape, h.dtype)


class ActivationToFp8(torch.autograd.Function):
    """activation(h) for h [tokens, n] into the FP8 input of the GEMM `fp8`; returns the
    stand-in of the activation's output shape ([tokens, n], or [tokens, n/2] gated). With
    grad_quantizer (grad_operand_quantizer of the GEMM producing h), h's gradient is returned as
    that quantizer's Float8Tensor (_grad_as_fp8), else in h's dtype."""

    @staticmethod
    def forward(ctx, h: Tensor, activation: str, limit: float, alpha: float, fp8: Fp8Call,
                grad_quantizer: Optional[Float8Quantizer]):
        data, scale_inv = _activation_fp8(h, activation, limit, alpha, fp8)
        ctx.args = (activation, limit, alpha)
        ctx.grad_quantizer = grad_quantizer
        ctx.save_for_backward(h)
        ctx.mark_non_differentiable(data, scale_inv)
        ctx.set_materialize_grads(False)  # the codes' gradients stay None, not zeros of their size
        return _stand_in(h, data.shape), data, scale_inv

    @staticmethod
    def backward(ctx, grad_output: Optional[Tensor], _grad_data, _grad_scale_inv):
        if grad_output is None:  # the output took no part in the loss
            return (None,) * 6
        (h,) = ctx.saved_tensors
        if ctx.grad_quantizer is not None:
            grad_h = _grad_as_fp8(grad_output, h, ctx.args, ctx.grad_quantizer)
        else:
            grad_h = _ops.activation_bwd(grad_output.contiguous(), h, None, *ctx.args)
        return grad_h, None, None, None, None, None


def norm_to_fp8(x: Tensor, weight: Tensor, bias: Optional[Tensor], rms: bool, eps: float, zero_centered_gamma: bool,
                fp8: Fp8Call, return_output: bool) -> Tuple[Tensor, Fp8Call]:
    """(NormToFp8's output, fp8 with the normalised x's FP8 codes as its input); where no
    backward is prepared (inference, decoding), the same without the autograd function."""
    if fp8.needs_backward:
        output, data, scale_inv = NormToFp8.apply(x, weight, bias, rms, eps, zero_centered_gamma, fp8, return_output)
    else:
        output, data, scale_inv, _, _ = _norm_fp8(x, weight, bias, rms, eps, zero_centered_gamma, fp8, return_output)
        output = output if return_output else _stand_in(x, x.shape)
    return output, dataclasses.replace(fp8, input_fp8=Float8Codes(data, scale_inv))


def activation_to_fp8(h: Tensor, activation: str, limit: float, alpha: float, fp8: Fp8Call,
                      grad_quantizer: Optional[Float8Quantizer] = None) -> Tuple[Tensor, Fp8Call]:
    """(ActivationToFp8's stand-in, fp8 with the activation's FP8 codes as its input); where
    no backward is prepared, the same without the autograd function. grad_quantizer: see
    ActivationToFp8."""
    if fp8.needs_backward:
        output, data, scale_inv = ActivationToFp8.apply(h, activation, limit, alpha, fp8, grad_quantizer)
    else:
        data, scale_inv = _activation_fp8(h, activation, limit, alpha, fp8)
        output = _stand_in(h, data.shape)
    return output, dataclasses.replace(fp8, input_fp8=Float8Codes(data, scale_inv))
