"""GEMMs for the Linear modules. The CPU has no FP8 matrix unit: operands (FP8, or bf16/fp16
activations) are widened to the fastest GEMM dtype this machine has (bf16 where the CPU has AVX512-BF16 or AMX, fp32
elsewhere, where oneDNN's bf16 GEMM is a slow fallback: measured 0.9 GFLOP/s against
64 GFLOP/s for fp32 on a 2-core AMD EPYC), multiplied with fp32 accumulation, and the result
is cast to the requested dtype. torch._scaled_mm is never used on CPU (a slow reference
there). On CUDA (and on MUSA where torch_musa implements it) per-tensor FP8 operands go to
torch._scaled_mm, the FP8 tensor-core GEMM; block-scaled operands are dequantised there too.
"""
from typing import Optional

import torch
from torch import Tensor

from .._autocast import autocast_disabled
from ..fp8.tensor import Float8Tensor

# Device types that have torch._scaled_mm kernels for FP8 (CUDA always; MUSA until a call
# shows that this torch_musa build lacks them).
_SCALED_MM_DEVICES = {"cuda", "musa"}


# Read once at import: torch.compile cannot trace these CPU feature queries.
_CPU_HAS_BF16_MATRIX_UNITS = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def cpu_gemm_dtype() -> torch.dtype:
    """The dtype CPU GEMMs of dequantised FP8 operands run in on this machine."""
    return torch.bfloat16 if _CPU_HAS_BF16_MATRIX_UNITS else torch.float32


def _matmul(a: Tensor, b: Tensor, bias: Optional[Tensor]) -> Tensor:
    """a @ b.T + bias in the operands' dtype, outside any torch.autocast region: the dtype was
    chosen here, and autocast would cast it back to its own (on CPUs without bf16 matrix
    units, to the slow bf16 GEMM the widening avoids)."""
    with autocast_disabled(a.device):
        return torch.nn.functional.linear(a, b, bias)


def gemm_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """What a GEMM of `dtype` operands on `device` computes in: on a CPU without bf16 matrix
    hardware, 16-bit operands are widened to fp32 (exact products, fp32 accumulation: the
    same numbers a bf16 GEMM with fp32 accumulation gives, about 70x faster there)."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return cpu_gemm_dtype()
    return dtype


def linear(a: Tensor, b: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T (+ bias) for high-precision a [m, k], b [n, k] -> [m, n] in a's dtype."""
    compute = gemm_dtype(a.device, a.dtype)
    out = _matmul(a.to(compute), b.to(compute), bias.to(compute) if bias is not None else None)
    return out.to(a.dtype)


def fp8_gemm(a, b, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T for FP8 operands a [m, k] and b [n, k] -> [m, n] in out_dtype (+ bias [n]).
    Operands are per-tensor (Float8Tensor) or block-scaled (fp8/block_tensor.py), each
    with its blocks along k."""
    if _scaled_mm_applies(a, b):
        try:
            return scaled_mm(a, b, out_dtype, bias)
        except (NotImplementedError, RuntimeError):
            if a.device.type != "musa":
                raise
            _SCALED_MM_DEVICES.discard("musa")  # this torch_musa has no FP8 GEMM: dequantise from now on
    compute = cpu_gemm_dtype() if a.device.type == "cpu" else out_dtype
    out = _matmul(a.dequantize(compute), b.dequantize(compute), bias.to(compute) if bias is not None else None)
    return out.to(out_dtype)


def _scaled_mm_applies(a, b) -> bool:
    """torch._scaled_mm takes per-tensor scales, dimensions in multiples of 16 and at least
    one E4M3 operand."""
    return (a.device.type in _SCALED_MM_DEVICES and isinstance(a, Float8Tensor) and isinstance(b, Float8Tensor)
            and a.data.dim() == 2 and all(size % 16 == 0 for size in (*a.shape, b.shape[0]))
            and torch.float8_e4m3fn in (a.dtype, b.dtype))


def scaled_mm(a: Float8Tensor, b: Float8Tensor, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T by torch._scaled_mm: the product of the codes, accumulated in fp32 and
    multiplied by both scale_invs. _scaled_mm wants its second operand column-major, which
    b's row-major codes [n, k] are once viewed as [k, n]."""
    out = torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale_inv.reshape(()).float(),
                           scale_b=b.scale_inv.reshape(()).float(), out_dtype=out_dtype)
    return out + bias.to(out_dtype) if bias is not None else out
