"""The GEMM of two NVFP4 operands in Triton: out = a @ b^T for a [m, k] and b [n, k] given as
packed E2M1 codes (uint8 [rows, k / 2], the even column in the low nibble) with an E4M3 scale per
16 values along k ([rows, k / 16]), as nvfp4_quantize writes them.

A program computes a [BLOCK_M, BLOCK_N] tile of out. Per BLOCK_K slice of k it decodes both
operands' tiles in registers, code * scale, which is exact in bf16 (a 2-bit by a 4-bit
significand, 2^-10 to 2688), so the tensor cores' products of two of them are exact in fp32 and
only the fp32 sums round. The epilogue is fp32 and follows TE's order: acc * alpha, then times
row_scales[i] * col_scales[j] where either is given (a missing one is 1: a row-scaled operand's
amaxes), then + bias[j], then one rounding to out_dtype (launched with enable_fp_fusion=False,
so that the bias is added to the rounded product, as the reference adds it).

Triton's interpreter (CPU tensors) multiplies bf16 wrongly in Triton 3.9: there the decoded
values enter the dot as fp32 (exact widening), with the same products. tl.dot_scaled is not used:
Triton 3.9 builds its E2M1 form with 16-element E4M3 scales into Blackwell's block-scaled MMA
(tcgen05.mma kind::mxf4nvf4 block16), but how that instruction accumulates could not be checked
without a Blackwell GPU.
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._device import fp8_runs
from .nvfp4 import _e2m1_value

BLOCK_M = BLOCK_N = 128
BLOCK_K = 64
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_LAUNCH = {"num_warps": 8, "num_stages": 3, "enable_fp_fusion": False}


def supports(op_name: str, args: tuple) -> bool:
    """k a multiple of 16 (whole scale blocks), a bf16, fp16 or fp32 output, on a device that
    converts E4M3 (the scales)."""
    a_data, k, out_dtype = args[0], args[4], args[9]
    return k % 16 == 0 and out_dtype in _OUT_DTYPES and fp8_runs(a_data.device, torch.float8_e4m3fn)


@triton.jit
def _decoded(DATA, SCALES, rows, row_ok, k_start, k, stride_data, stride_scales, ROWS: tl.constexpr,
             BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """[ROWS, BLOCK_K] values code * scale of rows at k_start.. in DOT_DTYPE (exact); zeros past k
    and past the last row."""
    pairs = k_start // 2 + tl.arange(0, BLOCK_K // 2)
    groups = k_start // 16 + tl.arange(0, BLOCK_K // 16)
    row_offsets = rows[:, None].to(tl.int64)
    packed = tl.load(DATA + row_offsets * stride_data + pairs[None, :],
                     mask=row_ok[:, None] & (pairs[None, :] < k // 2), other=0)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (ROWS, BLOCK_K))
    scale = tl.load(SCALES + row_offsets * stride_scales + groups[None, :],
                    mask=row_ok[:, None] & (groups[None, :] < k // 16), other=0.0).to(tl.float32)
    values = tl.reshape(_e2m1_value(codes), (ROWS, BLOCK_K // 16, 16)) * scale[:, :, None]
    return tl.reshape(values, (ROWS, BLOCK_K)).to(DOT_DTYPE)


@triton.jit
def _dot(a, b, acc):
    """acc + a @ b in fp32 sums: bf16 operands on the tensor cores, fp32 ones (the interpreter's)
    as fp32 (no TF32: their products are exact either way)."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _nvfp4_gemm_kernel(A, A_SCALES, B, B_SCALES, ALPHA, ROW_SCALES, COL_SCALES, BIAS, C, m, n, k,
                       stride_a, stride_a_scales, stride_b, stride_b_scales, HAS_ROW_SCALES: tl.constexpr,
                       HAS_COL_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < m, cols < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, k, BLOCK_K):
        a = _decoded(A, A_SCALES, rows, row_ok, k_start, k, stride_a, stride_a_scales, BLOCK_M, BLOCK_K, DOT_DTYPE)
        b = _decoded(B, B_SCALES, cols, col_ok, k_start, k, stride_b, stride_b_scales, BLOCK_N, BLOCK_K, DOT_DTYPE)
        acc = _dot(a, tl.trans(b), acc)
    acc = acc * tl.load(ALPHA)
    if HAS_ROW_SCALES or HAS_COL_SCALES:
        row_factor = tl.full((BLOCK_M,), 1.0, tl.float32)
        col_factor = tl.full((BLOCK_N,), 1.0, tl.float32)
        if HAS_ROW_SCALES:
            row_factor = tl.load(ROW_SCALES + rows, mask=row_ok, other=1.0)
        if HAS_COL_SCALES:
            col_factor = tl.load(COL_SCALES + cols, mask=col_ok, other=1.0)
        acc = acc * (row_factor[:, None] * col_factor[None, :])
    if HAS_BIAS:
        acc = acc + tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    offsets = rows.to(tl.int64)[:, None] * n + cols[None, :]
    tl.store(C + offsets, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _unit_column_stride(t: Tensor) -> Tensor:
    """t itself where its columns are adjacent (the kernel walks rows by their stride)."""
    return t if t.stride(1) == 1 else t.contiguous()


def nvfp4_gemm(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor, k: int, alpha: Tensor,
               row_scales: Optional[Tensor], col_scales: Optional[Tensor], bias: Optional[Tensor],
               out_dtype: torch.dtype) -> Tensor:
    m, n = a_data.shape[0], b_data.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a_data.device)
    if not (m and n):
        return out
    a_data, a_scales, b_data, b_scales = (_unit_column_stride(t) for t in (a_data, a_scales, b_data, b_scales))
    flags = {"HAS_ROW_SCALES": row_scales is not None, "HAS_COL_SCALES": col_scales is not None,
             "HAS_BIAS": bias is not None}
    # A missing vector's pointer is alpha's: the kernel reads a vector only where its flag is set.
    row_scales, col_scales, bias = (t.contiguous() if t is not None else alpha for t in (row_scales, col_scales, bias))
    dot_dtype = tl.float32 if a_data.device.type == "cpu" else tl.bfloat16  # the interpreter's dot: see above
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _nvfp4_gemm_kernel[grid](
        a_data, a_scales, b_data, b_scales, alpha, row_scales, col_scales, bias, out, m, n, k, a_data.stride(0),
        a_scales.stride(0), b_data.stride(0), b_scales.stride(0), **flags, DOT_DTYPE=dot_dtype, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, **_LAUNCH)
    return out
