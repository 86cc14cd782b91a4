"""The GEMM of two NVFP4 operands as a dispatcher op (defined here, not in C++):

    nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales?, col_scales?, bias?, out_dtype)
        -> [m, n]: a @ b^T for a [m, k], b [n, k] given as nvfp4_quantize's packed codes
        (uint8 [rows, k / 2]) and E4M3 scales ([rows, k / 16]); the epilogue in fp32: times
        alpha (fp32 [1]), times row_scales[i] (fp32 [m]) * col_scales[j] (fp32 [n]) where given
        (row-scaled operands), plus bias ([n]), one rounding to out_dtype.

On CUDA and MUSA the Triton kernel (triton/nvfp4_gemm.py) decodes the codes in registers and
multiplies them on the tensor cores; elsewhere the reference (reference/nvfp4.py). The CPU's
modules keep their own path (fp8/nvfp4_gemm.py: the values decoded exactly to bf16, then the
AVX512-BF16 / AMX GEMM kernel).
"""
from typing import Optional

import torch
from torch import Tensor

from .._extension import NAMESPACE
from ..reference import nvfp4 as reference
from . import _checks
from ._checks import fail, shape_text
from ._registry import serve_on_accelerators, serve_reference_on_cpu

_ops = getattr(torch.ops, NAMESPACE)
_fragment = torch.library.Library(NAMESPACE, "FRAGMENT")
_fragment.define("nvfp4_gemm(Tensor a_data, Tensor a_scales, Tensor b_data, Tensor b_scales, int k, Tensor alpha, "
                 "Tensor? row_scales, Tensor? col_scales, Tensor? bias, ScalarType out_dtype) -> Tensor")
OP = "nvfp4_gemm"


def _operand(name: str, data: Tensor, scales: Tensor, k: int, ref: Tensor) -> int:
    """The operand's rows, after checking its codes and scales."""
    _checks.dtype(OP, f"{name}_data", data, torch.uint8)
    if data.dim() != 2 or data.shape[1] != k // 2:
        fail(OP, f"{name}_data must be [rows, k / 2] = [rows, {k // 2}] (two codes a byte), got shape "
                 f"{shape_text(data.shape)}")
    _checks.dtype(OP, f"{name}_scales", scales, torch.float8_e4m3fn)
    _checks.shape(OP, f"{name}_scales", scales, (data.shape[0], k // 16), "one E4M3 scale per 16 values along k")
    for tensor, arg in ((data, f"{name}_data"), (scales, f"{name}_scales")):
        _checks.same_device(OP, arg, tensor, "a_data", ref)
    return data.shape[0]


def _vector(name: str, value: Optional[Tensor], length: int, ref: Tensor, meaning: str) -> None:
    if value is None:
        return
    _checks.same_device(OP, name, value, "a_data", ref)
    _checks.dtype(OP, name, value, torch.float32)
    _checks.shape(OP, name, value, (length,), meaning)


def check_nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype):
    if k < 0 or k % 16:
        fail(OP, f"k must be a non-negative multiple of 16 (whole scale blocks), got {k}")
    m = _operand("a", a_data, a_scales, k, a_data)
    n = _operand("b", b_data, b_scales, k, a_data)
    _vector("alpha", alpha, 1, a_data, "the global factor")
    _vector("row_scales", row_scales, m, a_data, "one per row of a")
    _vector("col_scales", col_scales, n, a_data, "one per row of b")
    if bias is not None:
        _checks.same_device(OP, "bias", bias, "a_data", a_data)
        _checks.shape(OP, "bias", bias, (n,), "one per output column")
    _checks.high_precision_dtype(OP, "out_dtype", out_dtype)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_gemm")
def _nvfp4_gemm_fake(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype):
    check_nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype)
    return a_data.new_empty((a_data.shape[0], b_data.shape[0]), dtype=out_dtype)


serve_reference_on_cpu(OP, reference.nvfp4_gemm, check=check_nvfp4_gemm)
serve_on_accelerators(OP, reference.nvfp4_gemm, triton_module="nvfp4_gemm", check=check_nvfp4_gemm)


def nvfp4_gemm(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor, k: int, alpha: Tensor,
               row_scales: Optional[Tensor], col_scales: Optional[Tensor], bias: Optional[Tensor],
               out_dtype: torch.dtype) -> Tensor:
    """a @ b^T of NVFP4 codes with TE's epilogue (see the module docstring)."""
    return _ops.nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, alpha, row_scales, col_scales, bias, out_dtype)
