"""The GEMM of two NVFP4 operands (fp8/nvfp4_operand.py) with TE's numerics: each element's
code times its block's E4M3 scale is exact in bf16 (a 2-bit by a 4-bit significand, within
bf16's range), so the products of two of them are exact in fp32; the sums are fp32, and the
global factor alpha = amax_a * amax_b / (6 * 6 * 448 * 448), in fp32 as TE computes it, is
applied once in fp32 with the bias, before the one rounding to the output dtype. (TE's GEMM
scales each 16-long block's sum by its two scales before adding it up; here the scales ride
with the values, a different fp32 summation order of the same exact products.)

The decoded values come from the dequantising op with the amax 2688 = 6 * 448, whose factor
scale * 2688 * fp32(1 / 2688) is every E4M3 scale itself exactly (tests/fp8/test_nvfp4_gemm.py
checks all of them); the CPU kernel (scaled_gemm) then sums them on its bf16 path (AVX512-BF16,
AMX) or as fp32 elsewhere. Both operands of a product must carry the random Hadamard transform
or neither: the transform is orthogonal along the contraction, so it cancels only in pairs.
"""
from typing import Optional, Union

import torch
from torch import Tensor

from ..custom_ops.linear import cpu_gemm_dtype
from ..custom_ops.nvfp4 import nvfp4_dequantize
from ..custom_ops.scaled_gemm import scaled_gemm, scaled_gemm_accumulate
from .nvfp4_operand import Nvfp4Pair, Nvfp4Usage

Nvfp4Operand = Union[Nvfp4Usage, Nvfp4Pair]
UNIT_AMAX = 6.0 * 448.0  # the amax whose dequantising factor is the block scale itself
ALPHA_DIVISOR = 6.0 * 6.0 * 448.0 * 448.0


def is_nvfp4(operand) -> bool:
    return isinstance(operand, (Nvfp4Usage, Nvfp4Pair))


def nvfp4_gemm(a: Nvfp4Operand, b: Nvfp4Operand, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T for NVFP4 operands a [m, k] and b [n, k] (a pair: its row-wise usage) -> [m, n]
    in out_dtype (+ bias [n])."""
    a, b = _usage(a), _usage(b)
    values = _decoded_dtype(a)
    return scaled_gemm(_decoded(a, values), _decoded(b, values), _alpha(a, b), None, bias, out_dtype)


def nvfp4_gemm_accumulate(a: Nvfp4Operand, b: Nvfp4Operand, out: Tensor) -> None:
    """out += a @ b.T (a weight gradient into main_grad), out added in fp32 before the rounding."""
    a, b = _usage(a), _usage(b)
    values = _decoded_dtype(a)
    scaled_gemm_accumulate(_decoded(a, values), _decoded(b, values), _alpha(a, b), None, out)


def _usage(operand: Nvfp4Operand) -> Nvfp4Usage:
    if isinstance(operand, Nvfp4Pair):
        if operand.rowwise is None:
            raise RuntimeError("this NVFP4 operand was cast for the column-wise usage only (no row-wise codes)")
        return operand.rowwise
    return operand


def _alpha(a: Nvfp4Usage, b: Nvfp4Usage) -> Tensor:
    if a.rht != b.rht:
        raise ValueError("nvfp4_gemm: one operand carries the random Hadamard transform and the other does not; "
                         "the transform cancels only when both do")
    return (a.amax.float() * b.amax.float().to(a.amax.device)) / ALPHA_DIVISOR


def _decoded_dtype(operand: Nvfp4Usage) -> torch.dtype:
    """bf16 where the CPU kernel sums bf16 values (or on accelerators), fp32 for the CPU's fp32 GEMM."""
    if operand.device.type == "cpu" and cpu_gemm_dtype() != torch.bfloat16:
        return torch.float32
    return torch.bfloat16


def _decoded(operand: Nvfp4Usage, dtype: torch.dtype) -> Tensor:
    """code * block scale of each element [rows, cols], exact in dtype."""
    unit = torch.full((1,), UNIT_AMAX, dtype=torch.float32, device=operand.device)
    return nvfp4_dequantize(operand.data, operand.scales, unit, operand.cols, dtype)
