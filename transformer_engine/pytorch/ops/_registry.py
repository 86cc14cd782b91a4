"""Where each op has a compiled kernel and where it runs the plain-PyTorch reference.

An accelerator key with no compiled kernel for an op gets the reference registered as its
implementation, so the same torch.ops call works on every device and build_info() can say
exactly which path runs.
"""
from typing import Callable, Dict, List

import torch

from .._extension import NAMESPACE

# Device type -> the dispatch key its tensors use (torch_musa runs under PrivateUse1).
ACCELERATOR_KEYS = {"cuda": "CUDA", "musa": "PrivateUse1"}

_library = torch.library.Library(NAMESPACE, "IMPL")
_reference_served: Dict[str, List[str]] = {}


def serve_reference_where_no_kernel(op_name: str, reference: Callable) -> None:
    """Registers `reference` for every accelerator key that has no compiled `op_name`."""
    qualified = f"{NAMESPACE}::{op_name}"
    for device, key in ACCELERATOR_KEYS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
            _library.impl(op_name, reference, key)
            _reference_served.setdefault(op_name, []).append(device)


def op_names() -> List[str]:
    return sorted(_reference_served)


def op_paths(op_name: str) -> Dict[str, str]:
    """{"cpu": "kernel", "cuda": "reference" | "kernel", "musa": ...} for one op."""
    qualified = f"{NAMESPACE}::{op_name}"
    paths = {"cpu": "kernel" if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU") else "missing"}
    for device in ACCELERATOR_KEYS:
        paths[device] = "reference" if device in _reference_served.get(op_name, []) else "kernel"
    return paths
