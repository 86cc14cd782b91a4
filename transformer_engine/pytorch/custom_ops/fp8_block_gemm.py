"""The GEMM of block-scaled FP8 operands as a dispatcher op (schema and CPU kernel:
bindings/fp8_block_gemm_ops.cpp):

    fp8_block_gemm(a_data, a_scale_inv, a_block, a_transposed, b_data, b_scale_inv, b_block,
                   b_transposed, bias?, out_dtype) -> [m, n]
        a @ b^T for a [m, k] and b [n, k], each given as fp8_block_quantize's codes and
        scale_inv with its block (rows, cols); a transposed operand stores its transpose
        (data [k, m]), as a column-wise Float8BlockTensor does. Every block lies along k.

On CUDA and MUSA the Triton kernel (triton/fp8_gemm.py) multiplies the codes on the tensor
cores, fp32 sums per k-block scaled in fp32; for layouts it does not take, the reference
dequantises both operands and runs scaled_gemm's numerics. On the CPU, operands whose scales
are all powers of two (E8M0, 'pow2' blocks) in blocks of powers of two (at least 32 along k) go
to te_kernels::gemm_bf16, which widens each code times its scale to bf16 (exact) as it reads it
and sums the exact products in fp32: no dequantised operand is written, and a decoding step reads
a weight's codes once, in place; other operands run the reference's dequantise-then-fp32-GEMM.
"""
from typing import List, Optional

import torch
from torch import Tensor

from .. import reference
from ..reference.fp8_block import block_grid
from .._extension import NAMESPACE
from . import _checks
from ._checks import fail, shape_text
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)


def _operand(name: str, data: Tensor, scale_inv: Tensor, block: List[int], transposed: bool):
    """(rows, k, k per scale) of one operand, after checking its codes, scales and block."""
    op = "fp8_block_gemm"
    _checks.fp8_format(op, f"{name}_data", data.dtype)
    if data.dim() != 2:
        fail(op, f"{name}_data must be 2-D, got shape {shape_text(data.shape)}")
    if len(block) != 2 or min(block) < 1:
        fail(op, f"{name}_block must be two positive sizes (rows, cols), got {list(block)}")
    if scale_inv.dtype not in (torch.uint8, torch.float32):
        fail(op, f"{name}_scale_inv must be float32 or uint8 (E8M0 exponents), got "
                 f"{_checks.aten_name(scale_inv.dtype)}")
    _checks.shape(op, f"{name}_scale_inv", scale_inv, block_grid(*data.shape, *block),
                  f"one scale per block of {block[0]} x {block[1]}")
    _checks.same_device(op, f"{name}_scale_inv", scale_inv, "a_data", data)
    rows, k = data.shape[::-1] if transposed else data.shape
    k_per_scale = block[0] if transposed else block[1]
    return rows, k, k_per_scale


def check_fp8_block_gemm(a_data, a_scale_inv, a_block, a_transposed, b_data, b_scale_inv, b_block, b_transposed, bias,
                         out_dtype):
    op = "fp8_block_gemm"
    m, k, _ = _operand("a", a_data, a_scale_inv, a_block, a_transposed)
    n, b_k, _ = _operand("b", b_data, b_scale_inv, b_block, b_transposed)
    _checks.same_device(op, "b_data", b_data, "a_data", a_data)
    if k != b_k:
        fail(op, f"a is [{m}, {k}] and b is [{n}, {b_k}]: both must have the same k (a @ b^T)")
    if (a_scale_inv.dtype == torch.uint8) != (b_scale_inv.dtype == torch.uint8):
        fail(op, "a_scale_inv and b_scale_inv must both be E8M0 (uint8) or both float32, got "
                 f"{_checks.aten_name(a_scale_inv.dtype)} and {_checks.aten_name(b_scale_inv.dtype)}")
    _checks.high_precision_dtype(op, "out_dtype", out_dtype)
    if bias is not None:
        _checks.same_device(op, "bias", bias, "a_data", a_data)
        _checks.shape(op, "bias", bias, (n,), "one per output column")


@torch.library.register_fake(f"{NAMESPACE}::fp8_block_gemm")
def _fp8_block_gemm_fake(a_data, a_scale_inv, a_block, a_transposed, b_data, b_scale_inv, b_block, b_transposed, bias,
                         out_dtype):
    check_fp8_block_gemm(a_data, a_scale_inv, a_block, a_transposed, b_data, b_scale_inv, b_block, b_transposed, bias,
                         out_dtype)
    m = a_data.shape[1] if a_transposed else a_data.shape[0]
    n = b_data.shape[1] if b_transposed else b_data.shape[0]
    return a_data.new_empty((m, n), dtype=out_dtype)


serve_on_accelerators("fp8_block_gemm", reference.fp8_block_gemm, triton_module="fp8_gemm",
                      check=check_fp8_block_gemm)


def fp8_block_gemm(a_data: Tensor, a_scale_inv: Tensor, a_block: List[int], a_transposed: bool, b_data: Tensor,
                   b_scale_inv: Tensor, b_block: List[int], b_transposed: bool, bias: Optional[Tensor],
                   out_dtype: torch.dtype) -> Tensor:
    """a @ b^T (+ bias) of block-scaled FP8 operands in out_dtype (see the module docstring)."""
    return _ops.fp8_block_gemm(a_data, a_scale_inv, list(a_block), a_transposed, b_data, b_scale_inv, list(b_block),
                               b_transposed, bias, out_dtype)
