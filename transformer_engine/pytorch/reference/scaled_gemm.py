"""Plain-PyTorch scaled_gemm: the sums in fp32 (products of bf16 or fp32 FP8 values are exact
there), the scale_invs and bias applied in fp32, one rounding to out_dtype."""
from typing import Optional

import torch
from torch import Tensor


def scaled_gemm(a: Tensor, b: Tensor, a_scale_inv: Optional[Tensor], b_scale_inv: Optional[Tensor],
                bias: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    out = a.float() @ b.float().t()  # [m, k] x [n, k]^T
    scale_invs = [s.float().reshape(()) for s in (a_scale_inv, b_scale_inv) if s is not None]
    if scale_invs:
        out = out * torch.prod(torch.stack(scale_invs))  # their fp32 product, applied once
    return (out if bias is None else out + bias.float()).to(out_dtype)
