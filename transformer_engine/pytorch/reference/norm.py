"""LayerNorm / RMSNorm with the ops' exact signatures and semantics, in plain PyTorch.

Shapes: input [..., H]; weight, bias [H]; mean, rstd [...] (input's leading dims).
Statistics and arithmetic in float32 (float64 for float64 input); outputs rounded once to
the input dtype, gradients of the parameters to the weight dtype.
    LayerNorm: y = (x - mean) * rstd * g + b,  rstd = 1/sqrt(biased var + eps)
    RMSNorm:   y = x * rstd * g,               rstd = 1/sqrt(mean(x^2) + eps)
    g = 1 + weight when zero_centered_gamma, else weight.
Residual add + norm: sum = input + residual (added in float32, rounded once to input's dtype),
output = norm(sum); grad_input = norm_backward(grad_output) + grad_sum, rounded once.
Norm -> FP8: data = fp8_quantize(output), amax = max |output| (output in input's dtype).
Rows whose float32 statistics overflow (finite values beyond ~1.8e19, whose squares exceed
FLT_MAX) take float64 statistics, rounded to float32, as the kernels do.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .fp8_cast import fp8_quantize


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gamma(weight: Tensor, zero_centered_gamma: bool, dtype: torch.dtype) -> Tensor:
    gamma = weight.to(dtype)
    return gamma + 1 if zero_centered_gamma else gamma


def _moments(x: Tensor, centered: bool) -> Tuple[Tensor, Tensor]:
    """(mean, biased variance) over the last dim in x's dtype; for RMSNorm (centered=False)
    mean 0 and the mean square."""
    mean = x.mean(dim=-1) if centered else x.new_zeros(x.shape[:-1])
    deviation = x - mean.unsqueeze(-1) if centered else x
    return mean, deviation.square().mean(dim=-1)


def _stats(x: Tensor, eps: float, centered: bool) -> Tuple[Tensor, Tensor]:
    """(mean, rstd) over the last dim. float32 rows whose variance overflowed take float64
    statistics; rows holding an inf or a NaN keep their non-finite float32 ones. A
    torch.where over all rows: no data-dependent branch."""
    mean, var = _moments(x, centered)
    rstd = torch.rsqrt(var + eps)
    if x.dtype != torch.float32:
        return mean, rstd
    wide_mean, wide_var = _moments(x.double(), centered)
    overflowed = ~torch.isfinite(var) & torch.isfinite(wide_var)
    wide_rstd = torch.rsqrt(wide_var + eps).float()
    return torch.where(overflowed, wide_mean.float(), mean), torch.where(overflowed, wide_rstd, rstd)


def layernorm_fwd(input: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    acc = stats_dtype(input.dtype)
    x = input.to(acc)
    mean, rstd = _stats(x, eps, centered=True)
    centered = x - mean.unsqueeze(-1)
    y = centered * rstd.unsqueeze(-1) * _gamma(weight, zero_centered_gamma, acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(input.dtype), mean, rstd


def layernorm_bwd(grad_output: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dx, dweight, dbias = _layernorm_grads(grad_output, input, mean, rstd, weight, zero_centered_gamma)
    return dx.to(input.dtype), dweight, dbias


def _layernorm_grads(grad_output: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                     zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """grad_input in the accumulation dtype (not yet rounded), parameter gradients in weight's."""
    acc = stats_dtype(input.dtype)
    dy = grad_output.to(acc)
    rstd = rstd.to(acc).unsqueeze(-1)
    xhat = (input.to(acc) - mean.to(acc).unsqueeze(-1)) * rstd
    gdy = dy * _gamma(weight, zero_centered_gamma, acc)
    dx = rstd * (gdy - gdy.mean(dim=-1, keepdim=True) - xhat * (gdy * xhat).mean(dim=-1, keepdim=True))
    hidden = input.shape[-1]
    dweight = (dy * xhat).reshape(-1, hidden).sum(dim=0)  # [rows, H] -> [H]
    dbias = dy.reshape(-1, hidden).sum(dim=0)
    return dx, dweight.to(weight.dtype), dbias.to(weight.dtype)


def rmsnorm_fwd(input: Tensor, weight: Tensor, eps: float,
                zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    acc = stats_dtype(input.dtype)
    x = input.to(acc)
    _, rstd = _stats(x, eps, centered=False)
    y = x * rstd.unsqueeze(-1) * _gamma(weight, zero_centered_gamma, acc)
    return y.to(input.dtype), rstd


def rmsnorm_bwd(grad_output: Tensor, input: Tensor, rstd: Tensor, weight: Tensor,
                zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    dx, dweight = _rmsnorm_grads(grad_output, input, rstd, weight, zero_centered_gamma)
    return dx.to(input.dtype), dweight


def _rmsnorm_grads(grad_output: Tensor, input: Tensor, rstd: Tensor, weight: Tensor,
                   zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    """grad_input in the accumulation dtype (not yet rounded), weight's gradient in weight's dtype."""
    acc = stats_dtype(input.dtype)
    dy = grad_output.to(acc)
    rstd = rstd.to(acc).unsqueeze(-1)
    xhat = input.to(acc) * rstd
    gdy = dy * _gamma(weight, zero_centered_gamma, acc)
    dx = rstd * (gdy - xhat * (gdy * xhat).mean(dim=-1, keepdim=True))
    dweight = (dy * xhat).reshape(-1, input.shape[-1]).sum(dim=0)  # [rows, H] -> [H]
    return dx, dweight.to(weight.dtype)


def _add(input: Tensor, residual: Tensor) -> Tensor:
    acc = stats_dtype(input.dtype)
    return (input.to(acc) + residual.to(acc)).to(input.dtype)


def add_layernorm_fwd(input: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                      zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    sum = _add(input, residual)
    output, mean, rstd = layernorm_fwd(sum, weight, bias, eps, zero_centered_gamma)
    return output, sum, mean, rstd


def add_layernorm_bwd(grad_output: Tensor, grad_sum: Tensor, sum: Tensor, mean: Tensor, rstd: Tensor,
                      weight: Tensor, zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dx, dweight, dbias = _layernorm_grads(grad_output, sum, mean, rstd, weight, zero_centered_gamma)
    return (dx + grad_sum.to(dx.dtype)).to(sum.dtype), dweight, dbias


def add_rmsnorm_fwd(input: Tensor, residual: Tensor, weight: Tensor, eps: float,
                    zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    sum = _add(input, residual)
    output, rstd = rmsnorm_fwd(sum, weight, eps, zero_centered_gamma)
    return output, sum, rstd


def add_rmsnorm_bwd(grad_output: Tensor, grad_sum: Tensor, sum: Tensor, rstd: Tensor, weight: Tensor,
                    zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    dx, dweight = _rmsnorm_grads(grad_output, sum, rstd, weight, zero_centered_gamma)
    return (dx + grad_sum.to(dx.dtype)).to(sum.dtype), dweight


def _fp8_outputs(output: Tensor, scale: Tensor, fp8_dtype: torch.dtype, return_output: bool) -> Tuple[Tensor, ...]:
    """(data, amax, output or an empty [0] placeholder)."""
    data, amax = fp8_quantize(output, scale, fp8_dtype)
    return data, amax, output if return_output else output.new_empty(0)


def layernorm_fp8_fwd(input: Tensor, weight: Tensor, bias: Optional[Tensor], scale: Tensor, fp8_dtype: torch.dtype,
                      eps: float, zero_centered_gamma: bool,
                      return_output: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    output, mean, rstd = layernorm_fwd(input, weight, bias, eps, zero_centered_gamma)
    data, amax, output = _fp8_outputs(output, scale, fp8_dtype, return_output)
    return data, amax, mean, rstd, output


def rmsnorm_fp8_fwd(input: Tensor, weight: Tensor, scale: Tensor, fp8_dtype: torch.dtype, eps: float,
                    zero_centered_gamma: bool, return_output: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    output, rstd = rmsnorm_fwd(input, weight, eps, zero_centered_gamma)
    data, amax, output = _fp8_outputs(output, scale, fp8_dtype, return_output)
    return data, amax, rstd, output
