"""The GEMM of two NVFP4 operands as dispatcher ops (schemas and CPU kernels: bindings/nvfp4_gemm_ops.cpp):

    nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales?, col_scales?, bias?, out_dtype)
        -> [m, n]: a @ b^T for a [m, k], b [n, k] given as nvfp4_quantize's packed codes
        (uint8 [rows, k / 2]) and E4M3 scales ([rows, k / 16]); the epilogue in fp32: times
        alpha (fp32 [1]), times row_scales[i] (fp32 [m]) * col_scales[j] (fp32 [n]) where given
        (row-scaled operands), plus bias ([n]), one rounding to out_dtype.

    nvfp4_gemm_accumulate(a_data, a_scales, b_data, b_scales, k, alpha, out) -> None
        out += alpha * (a @ b^T) in place, out's values added in fp32 before the one rounding
        (a weight gradient added into main_grad).

On the CPU the GEMM kernel (te_kernels::gemm_bf16) widens each code with its block scale to
bf16 (exact) as it packs the operands, and sums on its AVX512-BF16 / AMX path where present;
on CUDA and MUSA the Triton kernel (triton/nvfp4_gemm.py) decodes the codes in registers and
multiplies them on the tensor cores; the accumulating op runs the reference there
(reference/nvfp4.py).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._extension import NAMESPACE
from ..reference import nvfp4 as reference
from . import _checks
from ._checks import fail, shape_text
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)
OP = "nvfp4_gemm"


def _operand(op: str, name: str, data: Tensor, scales: Tensor, k: int, ref: Tensor) -> int:
    """The operand's rows, after checking its codes and scales."""
    _checks.dtype(op, f"{name}_data", data, torch.uint8)
    if data.dim() != 2 or data.shape[1] != k // 2:
        fail(op, f"{name}_data must be [rows, k / 2] = [rows, {k // 2}] (two codes a byte), got shape "
                 f"{shape_text(data.shape)}")
    _checks.dtype(op, f"{name}_scales", scales, torch.float8_e4m3fn)
    _checks.shape(op, f"{name}_scales", scales, (data.shape[0], k // 16), "one E4M3 scale per 16 values along k")
    for tensor, arg in ((data, f"{name}_data"), (scales, f"{name}_scales")):
        _checks.same_device(op, arg, tensor, "a_data", ref)
    return data.shape[0]


def _vector(op: str, name: str, value: Optional[Tensor], length: int, ref: Tensor, meaning: str) -> None:
    if value is None:
        return
    _checks.same_device(op, name, value, "a_data", ref)
    _checks.dtype(op, name, value, torch.float32)
    _checks.shape(op, name, value, (length,), meaning)


def _operands(op: str, a_data, a_scales, b_data, b_scales, k, alpha) -> Tuple[int, int]:
    """(m, n) after checking k, both operands and alpha."""
    if k < 0 or k % 16:
        fail(op, f"k must be a non-negative multiple of 16 (whole scale blocks), got {k}")
    m = _operand(op, "a", a_data, a_scales, k, a_data)
    n = _operand(op, "b", b_data, b_scales, k, a_data)
    _vector(op, "alpha", alpha, 1, a_data, "the global factor")
    return m, n


def check_nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype):
    m, n = _operands(OP, a_data, a_scales, b_data, b_scales, k, alpha)
    _vector(OP, "row_scales", row_scales, m, a_data, "one per row of a")
    _vector(OP, "col_scales", col_scales, n, a_data, "one per row of b")
    if bias is not None:
        _checks.same_device(OP, "bias", bias, "a_data", a_data)
        _checks.shape(OP, "bias", bias, (n,), "one per output column")
    _checks.high_precision_dtype(OP, "out_dtype", out_dtype)


def check_nvfp4_gemm_accumulate(a_data, a_scales, b_data, b_scales, k, alpha, out):
    op = "nvfp4_gemm_accumulate"
    m, n = _operands(op, a_data, a_scales, b_data, b_scales, k, alpha)
    _checks.same_device(op, "out", out, "a_data", a_data)
    _checks.shape(op, "out", out, (m, n), "[m, n]")
    _checks.high_precision_dtype(op, "out", out.dtype)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_gemm")
def _nvfp4_gemm_fake(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype):
    check_nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype)
    return a_data.new_empty((a_data.shape[0], b_data.shape[0]), dtype=out_dtype)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_gemm_accumulate")
def _nvfp4_gemm_accumulate_fake(a_data, a_scales, b_data, b_scales, k, alpha, out):
    check_nvfp4_gemm_accumulate(a_data, a_scales, b_data, b_scales, k, alpha, out)


serve_on_accelerators(OP, reference.nvfp4_gemm, triton_module="nvfp4_gemm", check=check_nvfp4_gemm)
serve_on_accelerators("nvfp4_gemm_accumulate", reference.nvfp4_gemm_accumulate, check=check_nvfp4_gemm_accumulate)


def nvfp4_gemm(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor, k: int, alpha: Tensor,
               row_scales: Optional[Tensor], col_scales: Optional[Tensor], bias: Optional[Tensor],
               out_dtype: torch.dtype) -> Tensor:
    """a @ b^T of NVFP4 codes with TE's epilogue (see the module docstring)."""
    return _ops.nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype)


def nvfp4_gemm_accumulate(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor, k: int, alpha: Tensor,
                          out: Tensor) -> None:
    """out += alpha * (a @ b^T) in place, out added in fp32 before the one rounding."""
    _ops.nvfp4_gemm_accumulate(a_data, a_scales, b_data, b_scales, k, alpha, out)
