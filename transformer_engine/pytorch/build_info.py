"""What this installation is: version, compiled backends, CPU SIMD tier, and for each op
whether a device runs a compiled kernel or the plain-PyTorch reference."""
from typing import Any, Dict

import torch

from ._extension import kernels
from .ops import _registry


def build_info() -> Dict[str, Any]:
    return {
        "version": kernels.version,
        "torch": torch.__version__,
        "backends": kernels.backends.split(","),
        "cpu_isa_detected": kernels.detected_cpu_isa(),
        "cpu_isa_active": kernels.active_cpu_isa(),
        "ops": {name: _registry.op_paths(name) for name in _registry.op_names()},
    }


def format_build_info(info: Dict[str, Any]) -> str:
    lines = [f"portable TransformerEngine {info['version']} (torch {info['torch']})",
             f"  backends compiled: {', '.join(info['backends'])}",
             f"  CPU SIMD: {info['cpu_isa_active']} (detected {info['cpu_isa_detected']})"]
    for name, paths in info["ops"].items():
        lines.append(f"  {name:<16} " + "  ".join(f"{dev}: {path}" for dev, path in paths.items()))
    return "\n".join(lines)
