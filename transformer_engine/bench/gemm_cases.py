"""The CPU GEMM alone: our gemm_bf16 kernel (the scaled_gemm op) against PyTorch's bf16 GEMM.

Providers on the same a [m, k] and b [n, k] (y = a b^T, the NT layout of a Linear forward):
    ours:        scaled_gemm of E4M3 codes with their scale_invs, bf16 out: TE's FP8 GEMM (the
                 codes widened inside the kernel; on AMX CPUs the tiles, else AVX512-BF16 dot
                 products, else fp32 FMAs)
    ours_packed: `ours` with b packed for the kernel once, ahead (pack_operand: a weight kept
                 across microbatches)
    ours_bf16:   scaled_gemm of the bf16 operands, fp32 out (fp32 sums, rounded once)
    ours_avx512: `ours` on the avx512 tier's AVX512-BF16 dot products, where the CPU has AMX: the
                 two kernels in one run
    eager:       torch.mm of the bf16 operands (oneDNN; its output rounded to bf16)
    compile:     torch.compile of that torch.mm
FLOPs: 2 m n k. CPU only: elsewhere scaled_gemm is torch._scaled_mm's business (linear_cases).
"""
from typing import Iterator, Tuple

import torch

from .. import _kernels
from ..pytorch.custom_ops.linear import gemm_dtype
from ..pytorch.custom_ops.scaled_gemm import pack_operand, scaled_gemm
from .harness import Case

Shape = Tuple[int, int, int]  # m, n, k
# [4096]^3: a Linear's GEMMs at 4096 tokens; 512 tokens, where packing b weighs more; 16 tokens,
# a decoding step (read in place, no packing).
SUITE = [(4096, 4096, 4096), (512, 4096, 4096), (16, 4096, 4096)]
TINY = dict(SUITE=[(20, 24, 36)])
ROUNDS = 10


def gemm_case(shape: Shape, device: torch.device) -> Case:
    m, n, k = shape
    a = torch.randn(m, k, device=device).bfloat16()
    b = torch.randn(n, k, device=device).bfloat16()
    a_codes, b_codes = (x.to(torch.float8_e4m3fn) for x in (a, b))  # |x| < 448: no saturation
    scale_inv = torch.ones(1, device=device)
    mm = torch.mm
    compiled = torch.compile(mm)

    def ours():
        return scaled_gemm(a_codes, b_codes, scale_inv, scale_inv, None, torch.bfloat16)

    packed = []  # b packed on the first call (a warm-up call): describe() never calls providers

    def ours_packed():
        if not packed:
            packed.append(pack_operand(b_codes))
        return scaled_gemm(a_codes, b_codes, scale_inv, scale_inv, None, torch.bfloat16, packed[0])

    def on_avx512():
        previous = _kernels.limit_cpu_isa("avx512")
        try:
            return ours()
        finally:
            _kernels.limit_cpu_isa(previous)

    providers = {"ours": ours, "ours_packed": ours_packed,
                 "ours_bf16": lambda: scaled_gemm(a, b, None, None, None, torch.float32)}
    if _kernels.detected_cpu_isa() == "amx":
        providers["ours_avx512"] = on_avx512
    if gemm_dtype(device, torch.bfloat16) == torch.bfloat16:  # torch's bf16 GEMM is not the slow one
        providers.update(eager=lambda: mm(a, b.t()), compile=lambda: compiled(a, b.t()))
    return Case(op="gemm", shape=shape, dtype=torch.bfloat16, mode="fwd", device=device, bytes=None,
                main_bytes=a.numel() * a.element_size(), flops=2.0 * m * n * k, providers=providers,
                fp8_providers=("ours", "ours_packed", "ours_avx512"))


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """Not in the quick suite (a [4096]^3 GEMM without bf16 units takes seconds), CPU only."""
    if not quick and device.type == "cpu":
        for shape in SUITE:
            yield gemm_case(shape, device)
