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


def autocast_input(x: Tensor) -> Tensor:
    """x in the enabled torch.autocast dtype of its device, else x unchanged."""
    device_type = x.device.type
    if not x.is_floating_point() or not torch.amp.is_autocast_available(device_type):
        return x
    if not torch.is_autocast_enabled(device_type):
        return x
    return x.to(torch.get_autocast_dtype(device_type))


def autocast_disabled(device: torch.device):
    """A context in which torch.autocast leaves `device`'s ops alone: for computations whose
    dtype was chosen on purpose (the GEMM widening of custom_ops/linear.py)."""
    if not torch.amp.is_autocast_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)
