"""What this installation is: version, compiled backends, CPU SIMD tier, and for each op
whether a device runs a compiled kernel or the plain-PyTorch reference."""
from typing import Any, Dict

import torch

from ._extension import kernels
from .custom_ops import _registry
from .custom_ops.linear import cpu_gemm_dtype
from .triton import triton_status


def build_info() -> Dict[str, Any]:
    return {
        "version": kernels.version,
        "torch": torch.__version__,
        "backends": kernels.backends.split(","),
        "cpu_isa_detected": kernels.detected_cpu_isa(),
        "cpu_isa_active": kernels.active_cpu_isa(),
        # bf16 GEMMs and the CPU's FP8 GEMMs: bf16 (FP8 through our gemm_bf16 kernel) or fp32.
        "cpu_gemm_dtype": str(cpu_gemm_dtype()).removeprefix("torch."),
        # What gemm_bf16 multiplies on: amx tiles, avx512_bf16 dot products or fp32 fma.
        "cpu_gemm_bf16_kernel": kernels.gemm_bf16_kernel(),
        # GPU ops marked "triton" run Triton kernels when triton is installed (else the reference).
        "triton": triton_status()[1],
        "ops": {name: _registry.op_paths(name) for name in _registry.op_names()},
    }


def format_build_info(info: Dict[str, Any]) -> str:
    lines = [f"portable TransformerEngine {info['version']} (torch {info['torch']})",
             f"  backends compiled: {', '.join(info['backends'])}",
             f"  CPU SIMD: {info['cpu_isa_active']} (detected {info['cpu_isa_detected']})",
             f"  CPU GEMMs: {info['cpu_gemm_dtype']}"
             + f" (FP8 and fp32-output bf16: our kernel on {info['cpu_gemm_bf16_kernel']}, fp32 sums)",
             f"  GPU kernels: {info['triton']}"]
    for name, paths in info["ops"].items():
        lines.append(f"  {name:<16} " + "  ".join(f"{dev}: {path}" for dev, path in paths.items()))
    return "\n".join(lines)
