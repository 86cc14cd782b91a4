"""torch.autocast support for our modules.

Inside an enabled `torch.autocast(device_type, dtype)` region for the input's device, a module
computes in the region's dtype and returns it, as TransformerEngine's modules do (their
activation dtype is the autocast dtype). Our kernels are custom ops, which autocast does not
cast by itself, so every module casts its input on entry; the parameters already follow the
input's dtype inside the modules, and their gradients come back in the parameters' own dtype
(fp32 master weights stay fp32), as with torch.nn.Linear under autocast.
"""
import contextlib

import torch
from torch import Tensor


def autocast_enabled(device_type: str) -> bool:
    """Whether an enabled torch.autocast region is open for `device_type` (never for a device
    type autocast does not support)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def autocast_enabled_for(t: Tensor) -> bool:
    """autocast_enabled for t's device. Asked around every GEMM: outside every region (the
    common case) one C call answers (a constant to torch.compile), without reading t.device,
    which makes a new torch.device object each time."""
    return torch._C._is_any_autocast_enabled() and autocast_enabled(t.device.type)


def autocast_input(x: Tensor) -> Tensor:
    """x in the enabled torch.autocast dtype of its device, else x unchanged."""
    if not x.is_floating_point() or not autocast_enabled_for(x):
        return x
    return x.to(torch.get_autocast_dtype(x.device.type))


def autocast_disabled(device: torch.device):
    """A context in which torch.autocast leaves `device`'s ops alone: for computations whose
    dtype was chosen on purpose (the GEMM widening of custom_ops/linear.py). Outside an enabled
    region there is nothing to switch off: a context that does nothing (entering and leaving
    torch.autocast costs more than all the other Python work around a small GEMM)."""
    if not torch._C._is_any_autocast_enabled() or not autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)
