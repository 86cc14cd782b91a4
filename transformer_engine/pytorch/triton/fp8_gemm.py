"""The GEMM of block-scaled FP8 operands in Triton (op fp8_block_gemm, custom_ops/fp8_block_gemm.py):
out = a @ b^T for a [m, k] and b [n, k], each operand's scales one per block along k.

Per k-block (the scale blocks' length along k: 128 for Float8BlockScaling, 32 for MXFP8) a
program multiplies its [BLOCK_M, k-block] and [k-block, BLOCK_N] tiles of FP8 codes on the
tensor cores, products summed in fp32, then applies that block's scale_invs (fp32, or E8M0
exponents read as powers of two) to the partial sum in fp32 and accumulates it; the bias is
added in fp32 and the result rounded once to out_dtype. An operand's scales cover rows_per_scale
rows (1 for 1 x k blocks, 128 for 128 x 128 ones); a transposed operand (data [k, rows], blocks
along its first dimension) is read through its strides, never copied.
"""
from typing import List, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._device import fp8_runs
from ._fp8 import e8m0_to_float

BLOCK_M = BLOCK_N = 128
_K_BLOCKS = (32, 128)  # MXFP8's, Float8BlockScaling's
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _logical(data: Tensor, scale_inv: Tensor, block: List[int], transposed: bool):
    """(codes [rows, k], scale_inv [row blocks, k blocks], (rows per scale, k per scale)) as
    views: a transposed operand stores its transpose."""
    if transposed:
        return data.t(), scale_inv.t(), (block[1], block[0])
    return data, scale_inv, (block[0], block[1])


def supports(op_name: str, args: tuple) -> bool:
    """Both operands' blocks span the same 32 or 128 elements of k, codes E4M3 or E5M2 (not
    both E5M2: the tensor cores take at most one) on a device that multiplies E4M3, the output
    bf16, fp16 or fp32."""
    a_data, a_scale_inv, a_block, a_transposed, b_data, b_scale_inv, b_block, b_transposed, _, out_dtype = args
    (_, _, (_, a_k)), (_, _, (_, b_k)) = (_logical(a_data, a_scale_inv, a_block, a_transposed),
                                          _logical(b_data, b_scale_inv, b_block, b_transposed))
    return (a_k == b_k and a_k in _K_BLOCKS and a_data.dtype in _FP8 and b_data.dtype in _FP8
            and torch.float8_e4m3fn in (a_data.dtype, b_data.dtype) and fp8_runs(a_data.device, torch.float8_e4m3fn)
            and out_dtype in (torch.bfloat16, torch.float16, torch.float32))


@triton.jit
def _block_scaled_gemm_kernel(A, B, A_SCALE_INV, B_SCALE_INV, BIAS, C, m, n, k,
                              stride_am, stride_ak, stride_bn, stride_bk, stride_sam, stride_sak, stride_sbn,
                              stride_sbk, A_ROWS_PER_SCALE: tl.constexpr, B_ROWS_PER_SCALE: tl.constexpr,
                              E8M0: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < m, cols < n
    depth = tl.arange(0, BLOCK_K)
    a_rows = rows.to(tl.int64)[:, None] * stride_am
    b_cols = cols.to(tl.int64)[None, :] * stride_bn
    a_scale_rows = (rows // A_ROWS_PER_SCALE).to(tl.int64) * stride_sam
    b_scale_cols = (cols // B_ROWS_PER_SCALE).to(tl.int64) * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_block in range(0, tl.cdiv(k, BLOCK_K)):
        ks = k_block * BLOCK_K + depth
        k_ok = ks < k
        # Codes past k read as 0: they add nothing to the products.
        a = tl.load(A + a_rows + ks.to(tl.int64)[None, :] * stride_ak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(B + b_cols + ks.to(tl.int64)[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        a_scale = tl.load(A_SCALE_INV + a_scale_rows + k_block * stride_sak, mask=row_ok, other=0)
        b_scale = tl.load(B_SCALE_INV + b_scale_cols + k_block * stride_sbk, mask=col_ok, other=0)
        if E8M0:
            a_scale = e8m0_to_float(a_scale.to(tl.int32))
            b_scale = e8m0_to_float(b_scale.to(tl.int32))
        partial = tl.dot(a, b, out_dtype=tl.float32)  # the block's sums of code products, in fp32
        acc += partial * (a_scale[:, None] * b_scale[None, :])
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    offsets = rows.to(tl.int64)[:, None] * n + cols[None, :]
    tl.store(C + offsets, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fp8_block_gemm(a_data: Tensor, a_scale_inv: Tensor, a_block: List[int], a_transposed: bool, b_data: Tensor,
                   b_scale_inv: Tensor, b_block: List[int], b_transposed: bool, bias: Optional[Tensor],
                   out_dtype: torch.dtype) -> Tensor:
    a, a_scales, (a_rows_per_scale, k_per_scale) = _logical(a_data, a_scale_inv, a_block, a_transposed)
    b, b_scales, (b_rows_per_scale, _) = _logical(b_data, b_scale_inv, b_block, b_transposed)
    (m, k), n = a.shape, b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m and n:
        e8m0 = a_scales.dtype == torch.uint8
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        _block_scaled_gemm_kernel[grid](
            a, b, a_scales, b_scales, bias.contiguous() if bias is not None else out, out, m, n, k, a.stride(0),
            a.stride(1), b.stride(0), b.stride(1), a_scales.stride(0), a_scales.stride(1), b_scales.stride(0),
            b_scales.stride(1), A_ROWS_PER_SCALE=a_rows_per_scale, B_ROWS_PER_SCALE=b_rows_per_scale, E8M0=e8m0,
            HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=k_per_scale, num_warps=8,
            num_stages=3)
    return out
