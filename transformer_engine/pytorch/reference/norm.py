"""LayerNorm / RMSNorm with the ops' exact signatures and semantics, in plain PyTorch.

Shapes: input [..., H]; weight, bias [H]; mean, rstd [...] (input's leading dims).
Statistics and arithmetic in float32 (float64 for float64 input); outputs rounded once to
the input dtype, gradients of the parameters to the weight dtype.
    LayerNorm: y = (x - mean) * rstd * g + b,  rstd = 1/sqrt(biased var + eps)
    RMSNorm:   y = x * rstd * g,               rstd = 1/sqrt(mean(x^2) + eps)
    g = 1 + weight when zero_centered_gamma, else weight.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gamma(weight: Tensor, zero_centered_gamma: bool, dtype: torch.dtype) -> Tensor:
    gamma = weight.to(dtype)
    return gamma + 1 if zero_centered_gamma else gamma


def layernorm_fwd(input: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    acc = stats_dtype(input.dtype)
    x = input.to(acc)
    mean = x.mean(dim=-1)
    centered = x - mean.unsqueeze(-1)
    rstd = torch.rsqrt(centered.square().mean(dim=-1) + eps)
    y = centered * rstd.unsqueeze(-1) * _gamma(weight, zero_centered_gamma, acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(input.dtype), mean, rstd


def layernorm_bwd(grad_output: Tensor, input: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor,
                  zero_centered_gamma: bool) -> Tuple[Tensor, Tensor, Tensor]:
    acc = stats_dtype(input.dtype)
    dy = grad_output.to(acc)
    rstd = rstd.to(acc).unsqueeze(-1)
    xhat = (input.to(acc) - mean.to(acc).unsqueeze(-1)) * rstd
    gdy = dy * _gamma(weight, zero_centered_gamma, acc)
    dx = rstd * (gdy - gdy.mean(dim=-1, keepdim=True) - xhat * (gdy * xhat).mean(dim=-1, keepdim=True))
    hidden = input.shape[-1]
    dweight = (dy * xhat).reshape(-1, hidden).sum(dim=0)  # [rows, H] -> [H]
    dbias = dy.reshape(-1, hidden).sum(dim=0)
    return dx.to(input.dtype), dweight.to(weight.dtype), dbias.to(weight.dtype)


def rmsnorm_fwd(input: Tensor, weight: Tensor, eps: float,
                zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    acc = stats_dtype(input.dtype)
    x = input.to(acc)
    rstd = torch.rsqrt(x.square().mean(dim=-1) + eps)
    y = x * rstd.unsqueeze(-1) * _gamma(weight, zero_centered_gamma, acc)
    return y.to(input.dtype), rstd


def rmsnorm_bwd(grad_output: Tensor, input: Tensor, rstd: Tensor, weight: Tensor,
                zero_centered_gamma: bool) -> Tuple[Tensor, Tensor]:
    acc = stats_dtype(input.dtype)
    dy = grad_output.to(acc)
    rstd = rstd.to(acc).unsqueeze(-1)
    xhat = input.to(acc) * rstd
    gdy = dy * _gamma(weight, zero_centered_gamma, acc)
    dx = rstd * (gdy - xhat * (gdy * xhat).mean(dim=-1, keepdim=True))
    dweight = (dy * xhat).reshape(-1, input.shape[-1]).sum(dim=0)  # [rows, H] -> [H]
    return dx.to(input.dtype), dweight.to(weight.dtype)
