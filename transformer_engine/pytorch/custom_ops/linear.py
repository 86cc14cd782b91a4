"""High-precision GEMMs for the Linear modules and the dtype CPU GEMMs run in.

bf16 runs in bf16 where the CPU has bf16 matrix units (AVX512-BF16 or AMX), else widened to
fp32 (measured on a 2-core AMD EPYC without them: oneDNN's bf16 GEMM 0.9 GFLOP/s, fp32 64);
fp16 is always widened to fp32 on the CPU, never narrowed to bf16. The FP8 GEMMs over
quantized operands (fp8/gemm.py) read the same choice.
"""
from typing import Optional

import torch
from torch import Tensor

from .._autocast import autocast_disabled
from .scaled_gemm import scaled_gemm, scaled_gemm_accumulate

# Read once at import: torch.compile cannot trace these CPU feature queries.
_CPU_HAS_BF16_MATRIX_UNITS = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
_cpu_gemm_dtype = torch.bfloat16 if _CPU_HAS_BF16_MATRIX_UNITS else torch.float32
# Up to this many rows of a (the tokens of a decoding step) go to our GEMM kernel, whose few-rows
# path reads the weight where it lies with its loads asked for ahead, on every CPU: on 2 Zen 4
# cores, bf16 [1, 4096] x [4096, 4096] took 1.0 ms there against 1.85 ms in ATen's bf16 GEMM; on
# 2 Zen 3 cores (AVX2, GEMMs in fp32), eight such layers one token through took 367 ms by widening
# each weight to fp32 for the fp32 GEMM, against 17 ms in ATen's bf16 GEMM.
_FEW_ROWS = 16


def cpu_gemm_dtype() -> torch.dtype:
    """The dtype CPU GEMMs run in on this machine: bf16 where the CPU has bf16 matrix units,
    fp32 elsewhere (or as set_cpu_gemm_dtype chose)."""
    return _cpu_gemm_dtype


def set_cpu_gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """Chooses the CPU GEMM dtype (torch.bfloat16 or torch.float32) from now on, whatever the
    hardware has; returns the previous choice. For tests: the bf16 paths run (slowly) on CPUs
    without bf16 units too."""
    global _cpu_gemm_dtype
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"set_cpu_gemm_dtype: dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    previous, _cpu_gemm_dtype = _cpu_gemm_dtype, dtype
    return previous


def gemm_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """What a GEMM of `dtype` operands on `device` computes in: on the CPU, bf16 in
    cpu_gemm_dtype() and fp16 in fp32 (exact products, fp32 sums: the numbers of an fp16
    GEMM with fp32 accumulation, never fewer mantissa bits)."""
    return _cpu_gemm_dtype_of(dtype) if device.type == "cpu" else dtype


def gemm_keeps_dtype(t: Tensor) -> bool:
    """Whether linear() multiplies t in t's own dtype (gemm_dtype(t.device, t.dtype) ==
    t.dtype). Asked before every small GEMM: read from t.is_cpu rather than t.device, which
    makes a new torch.device object each time."""
    dtype = t.dtype
    return dtype == torch.float32 or not t.is_cpu or _cpu_gemm_dtype_of(dtype) == dtype


def _cpu_gemm_dtype_of(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float16:
        return torch.float32
    if dtype == torch.bfloat16:
        return _cpu_gemm_dtype
    return dtype


def cast(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """t in `dtype` (None stays None). A tensor already in it is returned as it is, without
    the dispatch of a no-op .to(), which costs microseconds on every call of a small GEMM."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _matmul(a: Tensor, b: Tensor, bias: Optional[Tensor]) -> Tensor:
    """a @ b.T + bias in the operands' dtype, outside any torch.autocast region: the dtype was
    chosen here, and autocast would cast it back to its own (on CPUs without bf16 matrix
    units, to the slow bf16 GEMM the widening avoids)."""
    with autocast_disabled(a.device):
        return torch.nn.functional.linear(a, b, bias)


def cpu_kernel_reads_few_rows(rows: int) -> bool:
    """Whether a bf16 CPU GEMM whose a has `rows` rows goes to our kernel's few-rows path, which
    reads b where it lies on every CPU: exact products, fp32 sums, the numbers of the fp32 GEMM
    that cpu_gemm_dtype() chooses on CPUs without bf16 matrix units. (FP8 and NVFP4 GEMMs of any
    size take our kernel on every CPU: fp8/gemm.py, fp8/nvfp4_gemm.py.)"""
    return rows <= _FEW_ROWS


def on_few_rows_kernel(a: Tensor, b: Tensor) -> bool:
    """Whether few_rows_linear(a, b) serves: our kernel's few-rows path, for bf16 a [m <= _FEW_ROWS,
    k] and b [n, k] with rows contiguous on the CPU. The numerics are ATen's bf16 GEMM's, and
    those of the fp32 GEMM of the widened values: exact products, fp32 sums, one rounding (the
    bias added in fp32 before it)."""
    return (a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16 and a.is_cpu and a.dim() == 2 and b.dim() == 2
            and cpu_kernel_reads_few_rows(a.shape[0]) and b.stride(1) == 1)


def few_rows_linear(a: Tensor, b: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T (+ bias) on our kernel, where on_few_rows_kernel(a, b); no autograd formula."""
    return scaled_gemm(a, b, None, None, bias, a.dtype)


def linear(a: Tensor, b: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """a @ b.T (+ bias) for high-precision a [m, k], b [n, k] -> [m, n] in a's dtype. bf16 that
    the CPU would widen to fp32 goes, for few rows, to our kernel, which widens in registers
    instead of writing b in fp32 first (the same exact products and fp32 sums)."""
    compute = gemm_dtype(a.device, a.dtype)
    if compute != a.dtype and on_few_rows_kernel(a, b):
        return few_rows_linear(a, b, bias)
    return cast(_matmul(cast(a, compute), cast(b, compute), cast(bias, compute)), a.dtype)


def linear_accumulate(a: Tensor, b: Tensor, out: Tensor) -> None:
    """out += a @ b.T for high-precision a [m, k], b [n, k] (a weight gradient added into
    main_grad). On the CPU the product is summed in fp32 and added to out in fp32 before one
    rounding (scaled_gemm_accumulate: our kernel for bf16, the fp32 GEMM otherwise), as TE's GEMM
    with accumulate=True; elsewhere the product in a's dtype is added."""
    compute = gemm_dtype(a.device, a.dtype)
    if a.device.type != "cpu" or compute not in (torch.bfloat16, torch.float32):
        out.add_(_matmul(a, b, None).to(out.dtype))
        return
    scaled_gemm_accumulate(a.to(compute), b.to(compute), None, None, out)
