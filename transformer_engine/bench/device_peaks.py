"""The peak memory bandwidth and dense FLOP/s of the accelerator a benchmark runs on.

Known devices come from a table of vendors' published figures, found by the name torch reports
(torch.cuda.get_device_name / torch.musa.get_device_name); any other accelerator is measured
once by a probe (best of a few large device copies for GB/s, large matmuls for TFLOP/s). The
CPU has no entry: there the same-run copy of the harness is the bandwidth reference and no FLOP
peak is claimed.

FLOP figures are dense (no 2:4 sparsity) tensor-core peaks with FP32 accumulation, as PyTorch
matmuls use; fp32 is the plain (non-TF32) FP32 peak. fp16 rows use the bf16 figure (equal on
every device listed). Units: GB/s with 1 GB = 1e9 bytes, TFLOP/s with 1 TFLOP = 1e12 FLOP.
"""
import dataclasses
import re
from typing import Callable, Dict, FrozenSet, Optional, Tuple

import torch

from . import device_timing

MEASURED = "measured probe"
PROBE_COPY_BYTES = 1 << 30  # 1 GiB per buffer: far beyond any L2, so the copy runs from memory
PROBE_MATMUL_SIZE = 8192  # n of the n x n @ n x n probe matmul: 1.1 TFLOP, long enough to saturate
PROBE_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Peak figures of one device. source: "spec: <device>" (from the table) or MEASURED.
    A FLOP figure is None where the device has no such unit (A100: no FP8) or the vendor
    publishes none (or the probe cannot measure it: FP8)."""
    source: str
    memory_gbps: float
    bf16_tflops: Optional[float]
    fp8_tflops: Optional[float]
    fp32_tflops: Optional[float]

    def tflops(self, dtype: torch.dtype, fp8: bool = False) -> Optional[float]:
        """The peak a computation in `dtype` is held against; `fp8`: it runs in FP8 whatever
        its input dtype (FP8 recipes), so the FP8 peak. None for a dtype without a figure."""
        if fp8:
            return self.fp8_tflops
        if dtype in (torch.bfloat16, torch.float16):
            return self.bf16_tflops
        if dtype == torch.float32:
            return self.fp32_tflops
        return None

    def summary(self) -> str:
        """One line, e.g. "4800 GB/s; TFLOP/s bf16 989.4, fp8 1978.9, fp32 67.0 (spec: NVIDIA H200)"."""
        figures = ", ".join(f"{kind} {'-' if value is None else f'{value:.1f}'}" for kind, value in
                            (("bf16", self.bf16_tflops), ("fp8", self.fp8_tflops), ("fp32", self.fp32_tflops)))
        return f"{self.memory_gbps:.0f} GB/s; TFLOP/s {figures} ({self.source})"


# Words that name the vendor or packaging but not the chip variant; dropped before matching, so
# "NVIDIA A100-SXM4-80GB" and "A100 80GB" are one key. Memory sizes are kept: they tell variants
# apart (A100 40GB / 80GB), and an unlisted size (a new variant) falls through to the probe.
_NOISE = frozenset({"nvidia", "geforce", "tesla", "mtt", "moore", "threads", "sxm", "sxm4", "sxm5",
                    "hbm2", "hbm2e", "hbm3", "hbm3e"})


def name_key(name: str) -> FrozenSet[str]:
    """Lower-case alphanumeric words of a device name, without vendor/packaging words."""
    return frozenset(re.findall(r"[a-z0-9]+", name.lower())) - _NOISE


# device -> (names torch reports for it, GB/s, bf16, fp8, fp32 TFLOP/s); figures from the vendor's
# published sheets, named in the comment above each group.
_SPECS: Dict[str, Tuple[Tuple[str, ...], float, Optional[float], Optional[float], Optional[float]]] = {
    # NVIDIA H100 datasheet (SXM5, PCIe and NVL columns)
    "NVIDIA H100 SXM": (("NVIDIA H100 80GB HBM3",), 3350, 989.4, 1978.9, 67.0),
    "NVIDIA H100 PCIe": (("NVIDIA H100 PCIe",), 2000, 756.5, 1513.0, 51.0),
    "NVIDIA H100 NVL": (("NVIDIA H100 NVL",), 3900, 835.5, 1670.5, 60.0),
    # NVIDIA H200 datasheet (SXM and NVL columns)
    "NVIDIA H200": (("NVIDIA H200",), 4800, 989.4, 1978.9, 67.0),
    "NVIDIA H200 NVL": (("NVIDIA H200 NVL",), 4800, 835.5, 1670.5, 60.0),
    # NVIDIA H20 product brief
    "NVIDIA H20": (("NVIDIA H20",), 4000, 148.0, 296.0, 44.0),
    # NVIDIA A100 datasheet (no FP8 units); both 40GB forms have the same figures
    "NVIDIA A100 40GB": (("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), 1555, 312.0, None, 19.5),
    "NVIDIA A100 80GB SXM": (("NVIDIA A100-SXM4-80GB",), 2039, 312.0, None, 19.5),
    "NVIDIA A100 80GB PCIe": (("NVIDIA A100 80GB PCIe",), 1935, 312.0, None, 19.5),
    # NVIDIA L40S and L4 datasheets
    "NVIDIA L40S": (("NVIDIA L40S",), 864, 362.05, 733.0, 91.6),
    "NVIDIA L4": (("NVIDIA L4",), 300, 121.0, 242.5, 30.3),
    # NVIDIA Ada Lovelace architecture whitepaper; GeForce tensor cores run FP32-accumulate
    # matmuls at half their FP16-accumulate rate, and the FP32-accumulate rate is listed here.
    "NVIDIA GeForce RTX 4090": (("NVIDIA GeForce RTX 4090",), 1008, 165.2, 330.3, 82.6),
    # Moore Threads MTT S4000 and MTT S80 spec sheets: no FP8 figure for the S4000, no tensor
    # figures for the S80.
    "MTT S4000": (("MTT S4000",), 768, 100.0, None, 25.0),
    "MTT S80": (("MTT S80",), 448, None, None, 14.4),
}


def _table() -> Dict[FrozenSet[str], Peaks]:
    """name_key of every reported name -> that device's Peaks."""
    return {name_key(name): Peaks(f"spec: {device}", gbps, bf16, fp8, fp32)
            for device, (names, gbps, bf16, fp8, fp32) in _SPECS.items() for name in names}


SPEC_TABLE = _table()


def spec_peaks(name: str) -> Optional[Peaks]:
    """The table's figures for a device name as torch reports it, None when it is not listed.
    Matching ignores case, punctuation and vendor/packaging words, but not memory size or variant
    words (PCIe, NVL), so a variant missing from the table is measured rather than mistaken."""
    return SPEC_TABLE.get(name_key(name))


def best_seconds(fn: Callable[[], object], timer: device_timing.Timer, repeats: int = PROBE_REPEATS) -> float:
    """Shortest of `repeats` timed calls after one untimed warm-up call."""
    fn()
    return min(timer(fn) for _ in range(repeats))


def measure_peaks(device: torch.device, timer: Optional[device_timing.Timer] = None) -> Peaks:
    """Probe figures for a device not in the table: copy GB/s (bytes read + written) and bf16 /
    fp32 matmul TFLOP/s, each the best of PROBE_REPEATS timings. No FP8 figure: there is no
    FP8 matmul common to CUDA and MUSA builds of torch to probe with."""
    timer = timer or device_timing.timer_for(device)
    copy_s = _copy_seconds(device, timer)  # its buffers are freed before the matmul operands exist
    tflops = {dtype: 2.0 * PROBE_MATMUL_SIZE**3 / _matmul_seconds(device, dtype, timer) / 1e12
              for dtype in (torch.bfloat16, torch.float32)}
    return Peaks(MEASURED, 2 * PROBE_COPY_BYTES / copy_s / 1e9, tflops[torch.bfloat16], None, tflops[torch.float32])


def _copy_seconds(device: torch.device, timer: device_timing.Timer) -> float:
    src = torch.ones(PROBE_COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return best_seconds(lambda: dst.copy_(src), timer)


def _matmul_seconds(device: torch.device, dtype: torch.dtype, timer: device_timing.Timer) -> float:
    n = PROBE_MATMUL_SIZE
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return best_seconds(lambda: a @ b, timer)


def device_name(device: torch.device) -> Optional[str]:
    """The name torch reports for an accelerator (via torch.cuda / torch.musa), None on the CPU."""
    module = device_timing.device_module(device)
    return None if module is None else module.get_device_name(device)


def peaks_for(device: torch.device) -> Optional[Peaks]:
    """None on the CPU; the table's figures for a listed accelerator, else measured ones."""
    name = device_name(device)
    if name is None:
        return None
    return spec_peaks(name) or measure_peaks(device)
