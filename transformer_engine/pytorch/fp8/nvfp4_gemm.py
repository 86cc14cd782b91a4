"""The GEMM of two NVFP4 operands (fp8/nvfp4_operand.py) with TE's numerics: each element's
code times its block's E4M3 scale is exact in bf16 (a 2-bit by a 4-bit significand, within
bf16's range), so the products of two of them are exact in fp32; the sums are fp32, and the
global factor alpha = (amax_a * amax_b) * fp32(1 / (6 * 6 * E_a * E_b)) (E the operands'
global-scale bounds, 448 or 4over6's 256), in fp32 as TE computes it, is applied once in fp32
with the bias, before the one rounding to the output dtype. (TE's GEMM scales each 16-long
block's sum by its two scales before adding it up; here the scales ride with the values, a
different fp32 summation order of the same exact products.) A row-scaled operand (one amax
per row) takes TE's epilogue instead: the sums times fp32(1 / (6 * 6 * E_a * E_b)) in fp32,
then times amax_a[row] * amax_b (or per column for b), then the bias, then the one rounding.

The nvfp4_gemm ops (custom_ops/nvfp4_gemm.py) read the codes and scales as they are: on the CPU
the kernel widens them while packing its operands (to bf16 for the AVX512-BF16 dot products or
the AMX tiles, to fp32 for the FMA tiers of CPUs without them) or, for a's few rows (decoding),
decodes b in registers as it reads it; on CUDA / MUSA the Triton kernel decodes them in
registers. For a ragged k (not whole blocks of 16) the values are decoded first by the
dequantising op with the amax 2688 = 6 * 448, whose factor
scale * 2688 * fp32(1 / 2688) is every E4M3 scale itself exactly (tests/fp8/test_nvfp4_gemm.py
checks all of them), and summed by the scaled_gemm op. Both operands of a product must carry
the random Hadamard transform or neither: the transform is orthogonal along the contraction,
so it cancels only in pairs.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..custom_ops.linear import cpu_gemm_dtype
from ..custom_ops.nvfp4 import nvfp4_dequantize
from ..custom_ops.nvfp4_gemm import nvfp4_gemm as nvfp4_gemm_op
from ..custom_ops.nvfp4_gemm import nvfp4_gemm_accumulate as nvfp4_gemm_accumulate_op
from ..custom_ops.scaled_gemm import scaled_gemm, scaled_gemm_accumulate
from ..reference import nvfp4 as reference
from .nvfp4_operand import Nvfp4Pair, Nvfp4Usage

Nvfp4Operand = Union[Nvfp4Usage, Nvfp4Pair]
UNIT_AMAX = 6.0 * 448.0  # the amax whose dequantising factor is the block scale itself (E = 448)
E2M1_MAX = 6.0


def is_nvfp4(operand) -> bool:
    return isinstance(operand, (Nvfp4Usage, Nvfp4Pair))


def nvfp4_gemm(a: Nvfp4Operand, b: Nvfp4Operand, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T for NVFP4 operands a [m, k] and b [n, k] (a pair: its row-wise usage) -> [m, n]
    in out_dtype (+ bias [n])."""
    a, b = _usage(a), _usage(b)
    if _reads_codes(a):
        return _gemm_op(a, b, out_dtype, bias)
    values = _decoded_dtype(a)
    if not (a.row_scaled or b.row_scaled):
        return scaled_gemm(_decoded(a, values), _decoded(b, values), _alpha(a, b), None, bias, out_dtype)
    sums = scaled_gemm(_decoded(a, values), _decoded(b, values), _format_factor(a, b), None, None, torch.float32)
    return reference.gemm_epilogue(sums, *_row_and_col_scales(a, b), bias, out_dtype)


def _gemm_op(a: Nvfp4Usage, b: Nvfp4Usage, out_dtype: torch.dtype, bias: Optional[Tensor]) -> Tensor:
    """The nvfp4_gemm op's arguments for TE's epilogue: alpha alone, or with a row-scaled
    operand the format factor and the amaxes' per-row products."""
    if not (a.row_scaled or b.row_scaled):
        return nvfp4_gemm_op(a.data, a.scales, b.data, b.scales, a.cols, _alpha(a, b), None, None, bias, out_dtype)
    return nvfp4_gemm_op(a.data, a.scales, b.data, b.scales, a.cols, _format_factor(a, b), *_row_and_col_scales(a, b),
                         bias, out_dtype)


def _reads_codes(a: Nvfp4Usage) -> bool:
    """Whether the nvfp4_gemm ops take this product: k in whole blocks of 16 (b's k is a's, or the
    product fails), on every device. On CPUs whose GEMMs are fp32 (cpu_gemm_dtype) the kernel's
    FMA tiers sum the exact products without the pass that decodes both operands to fp32 for
    ATen's GEMM: te.Linear(1024, 5632) forward + backward over 2048 tokens 1.01-1.12x faster
    on 2 Zen 3 cores (benchmarks/results/avx2_zen3/fp8_gemm_route.md)."""
    return a.cols % 16 == 0


def _row_and_col_scales(a: Nvfp4Usage, b: Nvfp4Usage) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """(row_scales [m] or None, col_scales [n] or None) of a product with a row-scaled operand:
    each output element's amax_a * amax_b (TE's order), folded into the row-scaled side's."""
    if a.row_scaled and b.row_scaled:
        return a.amax.float(), b.amax.float()
    if a.row_scaled:
        return a.amax.float() * b.amax.float(), None
    return None, a.amax.float() * b.amax.float()


def nvfp4_gemm_accumulate(a: Nvfp4Operand, b: Nvfp4Operand, out: Tensor) -> None:
    """out += a @ b.T (a weight gradient into main_grad), out added in fp32 before the rounding."""
    a, b = _usage(a), _usage(b)
    if a.row_scaled or b.row_scaled:
        raise NotImplementedError("nvfp4_gemm_accumulate: row-scaled NVFP4 operands serve the forward GEMM only "
                                  "(as TE's); the backward casts gradients with one amax")
    if _reads_codes(a):
        nvfp4_gemm_accumulate_op(a.data, a.scales, b.data, b.scales, a.cols, _alpha(a, b), out)
        return
    values = _decoded_dtype(a)
    scaled_gemm_accumulate(_decoded(a, values), _decoded(b, values), _alpha(a, b), None, out)


def carries_rht(operand: Nvfp4Operand) -> bool:
    """Whether the codes a GEMM reads of this operand are of Hadamard-transformed values."""
    return _usage(operand).rht


def _usage(operand: Nvfp4Operand) -> Nvfp4Usage:
    if isinstance(operand, Nvfp4Pair):
        if operand.rowwise is None:
            raise RuntimeError("this NVFP4 operand was cast for the column-wise usage only (no row-wise codes)")
        return operand.rowwise
    return operand


def _format_factor(a: Nvfp4Usage, b: Nvfp4Usage) -> Tensor:
    """fp32(1 / (6 * 6 * E_a * E_b)), fp32 [1] (the product is exact in fp32)."""
    if a.rht != b.rht:
        raise ValueError("nvfp4_gemm: one operand carries the random Hadamard transform and the other does not; "
                         "the transform cancels only when both do")
    divisor = torch.tensor([E2M1_MAX * E2M1_MAX * a.e4m3_max * b.e4m3_max], dtype=torch.float32, device=a.device)
    return torch.ones_like(divisor) / divisor


def _alpha(a: Nvfp4Usage, b: Nvfp4Usage) -> Tensor:
    """TE's alpha: (amax_a * amax_b) * fp32(1 / (6 * 6 * E_a * E_b)), fp32 [1]."""
    return (a.amax.float() * b.amax.float().to(a.amax.device)) * _format_factor(a, b)


def _decoded_dtype(operand: Nvfp4Usage) -> torch.dtype:
    """bf16 where the CPU kernel sums bf16 values (or on accelerators), fp32 for the CPU's fp32 GEMM."""
    if operand.device.type == "cpu" and cpu_gemm_dtype() != torch.bfloat16:
        return torch.float32
    return torch.bfloat16


def _decoded(operand: Nvfp4Usage, dtype: torch.dtype) -> Tensor:
    """code * block scale of each element [rows, cols], exact in dtype."""
    unit = torch.full((1,), UNIT_AMAX, dtype=torch.float32, device=operand.device)
    return nvfp4_dequantize(operand.data, operand.scales, unit, operand.cols, dtype)
