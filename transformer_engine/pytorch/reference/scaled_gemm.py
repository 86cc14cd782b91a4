"""Plain-PyTorch scaled_gemm: the sums in fp32 (products of FP8 codes, or of their bf16 or fp32
values, are exact there), the scale_invs and bias applied in fp32, one rounding to out_dtype;
and the GEMM of block-scaled FP8 operands over it."""
from typing import List, Optional

import torch
from torch import Tensor

from .fp8_block import fp8_block_dequantize


def _scaled_sums(a: Tensor, b: Tensor, a_scale_inv: Optional[Tensor], b_scale_inv: Optional[Tensor]) -> Tensor:
    """a @ b^T in fp32 times the scale_invs' fp32 product, applied once."""
    sums = a.float() @ b.float().t()  # [m, k] x [n, k]^T
    scale_invs = [s.float().reshape(()) for s in (a_scale_inv, b_scale_inv) if s is not None]
    return sums * torch.prod(torch.stack(scale_invs)) if scale_invs else sums


def scaled_gemm(a: Tensor, b: Tensor, a_scale_inv: Optional[Tensor], b_scale_inv: Optional[Tensor],
                bias: Optional[Tensor], out_dtype: torch.dtype, b_packed: Optional[Tensor] = None) -> Tensor:
    """b_packed (the CPU kernel's layout of b) is not needed here: b is read as it is."""
    out = _scaled_sums(a, b, a_scale_inv, b_scale_inv)
    return (out if bias is None else out + bias.float()).to(out_dtype)


def scaled_gemm_accumulate(a: Tensor, b: Tensor, a_scale_inv: Optional[Tensor], b_scale_inv: Optional[Tensor],
                           out: Tensor) -> None:
    """out += the scaled product, out's values added in fp32 before the one rounding."""
    out.copy_((_scaled_sums(a, b, a_scale_inv, b_scale_inv) + out.float()).to(out.dtype))


def fp8_block_gemm(a_data: Tensor, a_scale_inv: Tensor, a_block: List[int], a_transposed: bool, b_data: Tensor,
                   b_scale_inv: Tensor, b_block: List[int], b_transposed: bool, bias: Optional[Tensor],
                   out_dtype: torch.dtype) -> Tensor:
    """a @ b^T of block-scaled FP8 operands (codes, scale_inv, block, transposed: a transposed
    operand stores its transpose): each dequantised to fp32, then scaled_gemm's numerics."""
    def values(data, scale_inv, block, transposed):
        dequantized = fp8_block_dequantize(data, scale_inv, block[0], block[1], torch.float32)
        return dequantized.t() if transposed else dequantized

    a = values(a_data, a_scale_inv, a_block, a_transposed)
    b = values(b_data, b_scale_inv, b_block, b_transposed)
    return scaled_gemm(a, b, None, None, bias, out_dtype)
