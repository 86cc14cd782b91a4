"""A pytest plugin that runs test code written for one CUDA GPU on the CPU.

TransformerEngine's own tests (tests/pytorch in NVIDIA/TransformerEngine) create every tensor
with device="cuda" and seed, synchronise and query the GPU through torch.cuda. Loaded with
`pytest -p cuda_on_cpu`, this plugin:
  - rewrites every device argument naming CUDA to the CPU (factories, Tensor.to, Tensor.cuda,
    torch.device("cuda") regions) through a TorchFunctionMode held for the whole session;
  - answers torch.cuda's queries as one Hopper-class device with cuDNN 9.18 (capability 9.0; while test modules
    are imported, torch.version.cuda 12.8, which module-level checks parse: afterwards None again,
    so that torch.compile's inductor does not look for a CUDA driver) and makes its
    synchronisation and seeding act on the CPU or do nothing;
  - answers torch.cuda's memory statistics from the tensors the tests put on "cuda" (created
    with that device, or moved there), still alive: the bytes of their storages. Tensors computed
    from them are not counted (nothing on the CPU tells a "cuda" tensor from another), so the
    figures are lower bounds. mem_get_info answers the machine's available and total memory;
  - maps torch.autocast(device_type="cuda") to the CPU's autocast and torch.Generator("cuda")
    to a CPU generator;
  - skips the cases that exercise CUDA hardware itself (CUDA graphs, streams, userbuffers,
    cuDNN / flash-attn backend selection), by the words in their node ids (HARDWARE_ONLY);
  - casts our flash kernel and our unfused path in the roles of TE's fused and unfused
    attention backends, which TE's attention tests compare (attention_roles.py).
"""
import functools
import os
import re

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

import attention_roles

# Words in a test's node id that mark it as testing CUDA hardware rather than the library's
# behaviour: nothing on the CPU can stand in for them.
# "FusedAttention" is not among them: our flash kernel plays that role (attention_roles.py).
HARDWARE_ONLY = ("cuda_graph", "graph_capture", "make_graphed_callables", "userbuffers", "cudnn", "flash_attn",
                 "FlashAttention", "multi_stream", "cpu_offload")

_CAPABILITY = (9, 0)
_CUDA_VERSION = "12.8"
# cuDNN 9.18.0, the newest that TE v2.18's attention tests ask for (torch's encoding): those
# tests then run on the backends that play cuDNN's roles here (attention_roles.py).
_CUDNN_VERSION = 91800
_BUILD_CUDA_VERSION = torch.version.cuda  # None on the CPU build


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


def _names_cuda(device) -> bool:
    return device is not _cpu_if_cuda(device)


class MappedMemory:
    """The live storages of tensors put on the mapped "cuda" device, for torch.cuda's memory
    statistics. Storages, weakly: a Parameter made of a "cuda" tensor is another tensor object
    over the same storage."""

    def __init__(self):
        self._storages = {}  # storage address -> (StorageWeakRef, bytes)
        self._pruned_at = 1024
        self._peak = 0

    def put(self, result):
        if isinstance(result, torch.Tensor) and result.device.type == "cpu":
            if type(result).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
                return result  # a wrapper subclass (an FP8 tensor) has no storage; its data are put on their own
            storage = result.untyped_storage()
            self._storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
            if len(self._storages) > 2 * self._pruned_at:  # dead entries dropped now and then, not on every put
                self._prune()
                self._pruned_at = max(1024, len(self._storages))
        return result

    def _prune(self) -> None:
        self._storages = {ptr: entry for ptr, entry in self._storages.items() if not entry[0].expired()}

    def _current(self) -> int:
        self._prune()
        return sum(nbytes for _, nbytes in self._storages.values())

    def allocated(self, device=None) -> int:
        current = self._current()
        self._peak = max(self._peak, current)  # the peak is only seen when asked for
        return current

    def peak(self, device=None) -> int:
        self.allocated()
        return self._peak

    def reset_peak(self, device=None) -> None:
        self._peak = self._current()


MAPPED_MEMORY = MappedMemory()


def _mem_get_info(device=None):
    """(free, total) bytes of the machine's memory, as /proc/meminfo gives them."""
    fields = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, value = line.split(":")
            fields[name] = int(value.split()[0]) * 1024
    return fields["MemAvailable"], fields["MemTotal"]


class CudaAsCpu(TorchFunctionMode):
    """Every torch call sees the CPU wherever it was given a CUDA device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return MAPPED_MEMORY.put(args[0])
        if func is torch.Tensor.pin_memory:
            return args[0]
        to_cuda = False
        if "device" in kwargs:
            to_cuda = _names_cuda(kwargs["device"])
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        if func is torch.Tensor.to:
            to_cuda = to_cuda or any(_names_cuda(a) for a in args[1:] if isinstance(a, (str, torch.device)))
            args = (args[0],) + tuple(_cpu_if_cuda(a) if isinstance(a, (str, torch.device)) else a for a in args[1:])
        kwargs.pop("pin_memory", None)
        result = func(*args, **kwargs)
        return MAPPED_MEMORY.put(result) if to_cuda else result


class _Properties:
    """What torch.cuda.get_device_properties answers for the mapped device."""
    name = "CPU (cuda mapped)"
    major, minor = _CAPABILITY
    total_memory = 80 * 2**30
    multi_processor_count = 132
    L2_cache_size = 50 * 2**20


class _CpuGenerator(torch.Generator):
    """torch.Generator with a CUDA device made on the CPU (a class, not a torch function, so
    the TorchFunctionMode does not see it); still a torch.Generator."""

    def __new__(cls, device="cpu"):
        return super().__new__(cls, _cpu_if_cuda(device))

    def __init__(self, device="cpu"):
        pass  # made in __new__


class _CpuAutocast(torch.autocast):
    def __init__(self, device_type="cuda", *args, **kwargs):
        super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)


def _nothing():
    """A fresh do-nothing function: torch.compile refuses one object standing for two torch.cuda functions."""
    return lambda *args, **kwargs: None


def pytest_configure(config):
    # One device, or under torchrun (a multi-process TE test) one per local rank.
    install(device_count=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    attention_roles.install()


def install(device_count: int = 1) -> None:
    """Maps CUDA to the CPU in this process (what the plugin does for a pytest session; a rank
    of a multi-process TE test calls it itself, with the ranks' count as the device count)."""
    cuda = torch.cuda
    patches = {
        "is_available": lambda: True, "device_count": lambda: device_count, "current_device": lambda: 0,
        "is_initialized": lambda: True, "init": _nothing(), "set_device": _nothing(), "synchronize": _nothing(),
        "manual_seed": _nothing(), "manual_seed_all": _nothing(), "seed": _nothing(), "seed_all": _nothing(),
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "get_device_capability": lambda device=None: _CAPABILITY,
        "get_device_name": lambda device=None: _Properties.name,
        "get_device_properties": lambda device=None: _Properties(),
        "is_bf16_supported": lambda including_emulation=True: True,
        "empty_cache": _nothing(), "reset_peak_memory_stats": MAPPED_MEMORY.reset_peak,
        "memory_allocated": MAPPED_MEMORY.allocated, "max_memory_allocated": MAPPED_MEMORY.peak,
        "memory_reserved": MAPPED_MEMORY.allocated, "max_memory_reserved": MAPPED_MEMORY.peak,
        "mem_get_info": _mem_get_info,
    }
    for name, value in patches.items():
        setattr(cuda, name, value)
        if hasattr(cuda.memory, name):  # tests call torch.cuda.memory.mem_get_info too
            setattr(cuda.memory, name, value)
    torch.backends.cudnn.is_available = lambda: True
    torch.backends.cudnn.version = lambda: _CUDNN_VERSION
    torch.version.cuda = _CUDA_VERSION  # until pytest_collection_finish
    torch.autocast = _CpuAutocast
    torch.Generator = _CpuGenerator
    cuda.amp.autocast = functools.partial(_CpuAutocast, "cuda")
    torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype("cpu")
    torch.is_autocast_enabled = functools.partial(_autocast_enabled_on_cpu, torch.is_autocast_enabled)
    # Held for the whole session, so that collection, fixtures and teardown see the CPU too.
    CudaAsCpu().__enter__()


def _autocast_enabled_on_cpu(original, device_type=None):
    return original("cpu") if device_type in (None, "cuda") else original(device_type)


def pytest_collection_finish(session):
    imports_done()


def imports_done() -> None:
    """The test modules are imported: torch.version.cuda is the build's again (None on the
    CPU), so that inductor compiles for the CPU."""
    torch.version.cuda = _BUILD_CUDA_VERSION


# A word counts where no letter or digit runs into it from the left: "FusedAttention" marks
# "backend-FusedAttention" but not "UnfusedAttention", TE's PyTorch path, which runs here.
_HARDWARE_WORD = re.compile("|".join(f"(?<![a-z0-9]){re.escape(word.lower())}" for word in HARDWARE_ONLY))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HARDWARE_WORD.search(item.nodeid.lower()):
            item.add_marker(pytest.mark.skip(reason="exercises CUDA hardware (cuda_on_cpu.HARDWARE_ONLY)"))
