"""A pytest plugin that runs test code written for one CUDA GPU on the CPU.

TransformerEngine's own tests (tests/pytorch in NVIDIA/TransformerEngine) create every tensor
with device="cuda" and seed, synchronise and query the GPU through torch.cuda. Loaded with
`pytest -p cuda_on_cpu`, this plugin:
  - rewrites every device argument naming CUDA to the CPU (factories, Tensor.to, Tensor.cuda,
    torch.device("cuda") regions) through a TorchFunctionMode held for the whole session;
  - answers torch.cuda's queries as one Hopper-class device (capability 9.0) and makes its
    synchronisation, seeding and memory statistics act on the CPU or do nothing;
  - maps torch.autocast(device_type="cuda") to the CPU's autocast;
  - skips the cases that exercise CUDA hardware itself (CUDA graphs, streams, userbuffers,
    cuDNN / flash backend selection), by the words in their node ids (HARDWARE_ONLY).
"""
import functools

import pytest
import torch
from torch.overrides import TorchFunctionMode

# Words in a test's node id that mark it as testing CUDA hardware rather than the library's
# behaviour: nothing on the CPU can stand in for them.
HARDWARE_ONLY = ("cuda_graph", "graph_capture", "make_graphed_callables", "userbuffers", "cudnn", "flash_attn",
                 "FlashAttention", "FusedAttention", "multi_stream", "cpu_offload")

_CAPABILITY = (9, 0)


def _cpu_if_cuda(device):
    """device with any CUDA device replaced by the CPU; an int names a CUDA ordinal."""
    if isinstance(device, bool):
        return device
    if isinstance(device, int):
        return torch.device("cpu")
    if isinstance(device, str) and device.split(":")[0] == "cuda":
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class CudaAsCpu(TorchFunctionMode):
    """Every torch call sees the CPU wherever it was given a CUDA device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        if func is torch.Tensor.to:
            args = (args[0],) + tuple(_cpu_if_cuda(a) if isinstance(a, (str, torch.device)) else a for a in args[1:])
        kwargs.pop("pin_memory", None)
        return func(*args, **kwargs)


class _Properties:
    """What torch.cuda.get_device_properties answers for the mapped device."""
    name = "CPU (cuda mapped)"
    major, minor = _CAPABILITY
    total_memory = 80 * 2**30
    multi_processor_count = 132
    L2_cache_size = 50 * 2**20


class _CpuAutocast(torch.autocast):
    def __init__(self, device_type="cuda", *args, **kwargs):
        super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)


def _nothing():
    """A fresh do-nothing function: torch.compile refuses one object standing for two torch.cuda functions."""
    return lambda *args, **kwargs: None


def _zero():
    return lambda *args, **kwargs: 0


def pytest_configure(config):
    cuda = torch.cuda
    patches = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "is_initialized": lambda: True, "init": _nothing(), "set_device": _nothing(), "synchronize": _nothing(),
        "manual_seed": _nothing(), "manual_seed_all": _nothing(), "seed": _nothing(), "seed_all": _nothing(),
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "get_device_capability": lambda device=None: _CAPABILITY,
        "get_device_name": lambda device=None: _Properties.name,
        "get_device_properties": lambda device=None: _Properties(),
        "is_bf16_supported": lambda including_emulation=True: True,
        "empty_cache": _nothing(), "reset_peak_memory_stats": _nothing(), "memory_allocated": _zero(),
        "max_memory_allocated": _zero(), "memory_reserved": _zero(), "max_memory_reserved": _zero(),
    }
    for name, value in patches.items():
        setattr(cuda, name, value)
    torch.autocast = _CpuAutocast
    cuda.amp.autocast = functools.partial(_CpuAutocast, "cuda")
    torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype("cpu")
    torch.is_autocast_enabled = functools.partial(_autocast_enabled_on_cpu, torch.is_autocast_enabled)
    # Held for the whole session, so that collection, fixtures and teardown see the CPU too.
    CudaAsCpu().__enter__()


def _autocast_enabled_on_cpu(original, device_type=None):
    return original("cpu") if device_type in (None, "cuda") else original(device_type)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(word.lower() in item.nodeid.lower() for word in HARDWARE_ONLY):
            item.add_marker(pytest.mark.skip(reason="exercises CUDA hardware (cuda_on_cpu.HARDWARE_ONLY)"))
