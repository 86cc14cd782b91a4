"""What a device's Triton backend can do, as the kernels' supports() need to know it."""
from typing import Tuple

import torch

INTERPRETER_PROGRAMS = 16  # Triton's interpreter runs programs one after another
# The first GPUs that convert to and multiply E4M3: NVIDIA sm_89 (Ada, then Hopper and later;
# Triton refuses E4M3 for sm_80) and Moore Threads MP31 (the S5000 class; earlier MUSA parts
# have E5M2 only).
_E4M3_CAPABILITY = {"cuda": (8, 9), "musa": (3, 1)}
E4M3_ABSENT = ("E4M3 needs CUDA sm_89 or later, or a MUSA MP31 (S5000-class) part; on older GPUs "
               "E4M3 casts and GEMMs run the reference")


def _device_module(device: torch.device):
    return torch.cuda if device.type == "cuda" else torch.musa


def resident_programs(device: torch.device, per_multiprocessor: int = 4) -> int:
    """A few programs per multiprocessor on a GPU (CUDA, or MUSA through torch_musa's same
    device-properties API), enough to fill it; INTERPRETER_PROGRAMS on CPU tensors."""
    if device.type in _E4M3_CAPABILITY:
        return per_multiprocessor * _device_module(device).get_device_properties(device).multi_processor_count
    return INTERPRETER_PROGRAMS


def has_e4m3(device: torch.device) -> bool:
    """Whether Triton converts to and multiplies E4M3 on this device (always in the interpreter)."""
    if device.type not in _E4M3_CAPABILITY:
        return True
    capability: Tuple[int, int] = tuple(_device_module(device).get_device_capability(device))
    return capability >= _E4M3_CAPABILITY[device.type]


def fp8_runs(device: torch.device, *fp8_dtypes: torch.dtype) -> bool:
    """Whether the device's Triton backend handles every one of these FP8 formats."""
    return torch.float8_e4m3fn not in fp8_dtypes or has_e4m3(device)
