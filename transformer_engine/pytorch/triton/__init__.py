"""GPU kernels written in Triton: one source for CUDA and for MUSA (torch_musa's Triton backend).

Triton is an optional dependency, imported only when a kernel first runs on a GPU tensor:
this file imports nothing from it, and `import transformer_engine.pytorch` on a machine
without a GPU never does. custom_ops/_registry.py registers the kernels under the accelerators'
dispatch keys when triton is installed, the plain-PyTorch reference otherwise.

Each kernel module takes tensors of any device Triton can run on; the tests run them on CPU
tensors in Triton's interpreter and compile them for sm_90 and sm_100 (tests/helpers/triton_harness.py).
"""
import importlib.metadata
import importlib.util
from typing import Tuple

from ._device import E4M3_ABSENT


def triton_status() -> Tuple[bool, str]:
    """(installed, what build_info says): found without importing triton."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install triton)"
    return True, f"triton {importlib.metadata.version('triton')} ({E4M3_ABSENT})"
