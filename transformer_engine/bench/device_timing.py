"""How long one call takes, per device type.

CPU: wall time (perf_counter) around the call. CUDA and MUSA: a pair of device events recorded
on the current stream before and after the call, read after synchronizing. torch_musa registers
`torch.musa` with the same Event / synchronize / get_device_name API as `torch.cuda`, so both are
reached through the device module (`getattr(torch, device.type)`) by one code path.

The L2 cache is deliberately not flushed between calls: the memory-bound cases run at realistic
sizes (tens of MiB and more per tensor), far beyond the L2 of current GPUs (50-60 MiB on
H100/H200), so a flush would only add a kernel to every round without changing what is measured.
"""
import time
from types import ModuleType
from typing import Callable, Optional

import torch

Timer = Callable[[Callable[[], object]], float]  # fn -> seconds for one fn() call


def device_module(device: torch.device) -> Optional[ModuleType]:
    """torch.cuda / torch.musa (any `torch.<type>` with timing events) for an accelerator device,
    None for the CPU. Raises ValueError naming the device when its module is not loaded."""
    if device.type == "cpu":
        return None
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "Event") or not hasattr(module, "synchronize"):
        raise ValueError(f"device {device}: torch.{device.type} with Event/synchronize is not available "
                         f"(for musa, import torch_musa first)")
    return module


def cpu_time(fn: Callable[[], object]) -> float:
    """Seconds of wall time for one fn() call, including freeing what it returns."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class EventTimer:
    """Device time of one call from a start/end event pair of `module` (torch.cuda or torch.musa).

    The stream is drained first, so every call starts on an idle device and earlier work (the
    previous provider of the round) is not counted; the end event is recorded after fn() returns,
    so host-side launch overhead that leaves the device idle is counted, as a user would see it.
    Events belong to the module's current device and stream, where the cases run."""

    def __init__(self, module: ModuleType):
        self.module = module
        self.start = module.Event(enable_timing=True)
        self.end = module.Event(enable_timing=True)

    def __call__(self, fn: Callable[[], object]) -> float:
        self.module.synchronize()
        self.start.record()
        fn()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3  # elapsed_time is in milliseconds


def timer_for(device: torch.device) -> Timer:
    """The timer of `device`: cpu_time on the CPU, an EventTimer on CUDA / MUSA."""
    module = device_module(device)
    return cpu_time if module is None else EventTimer(module)
