"""Interleaved benchmark harness, generic over op families.

A Case holds zero-arg callables, one per provider ("ours", "eager", "compile"), over tensors
allocated once. run_case warms each up, then times R rounds; every round calls each provider
once, plus a `dst.copy_(src)` of at least MIN_COPY_BYTES as a same-run bandwidth reference, in
an order rotated from round to round. Because the cores are shared and noisy, every comparison
(speedups, fraction of copy bandwidth) is the median over rounds of that round's ratio, never
a ratio of separate medians.

Units: times in seconds internally and milliseconds (ms) in rows; bytes per second as GB/s with
1 GB = 1e9 bytes; FLOP/s as TFLOP/s with 1 TFLOP = 1e12 FLOP.
"""
import csv
import ctypes
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import weakref
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import transformer_engine.pytorch as te

from . import device_peaks, device_timing

EAGER, COMPILE, COPY = "eager", "compile", "copy"
MIN_COPY_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# mallopt takes a C int, so 2^31-1 (2 GiB) is the largest trim threshold it can set; a larger
# Python int is silently truncated by ctypes (1 << 40 would become 0: trim on every free).
_TRIM_THRESHOLD = 2**31 - 1
GLIBC_SETTING = "glibc mallopt M_MMAP_MAX=0 M_TRIM_THRESHOLD=2^31-1"
ROW_FIELDS = ("op", "provider", "shape", "dtype", "mode", "device", "isa", "version", "torch",
              "git_commit", "timestamp", "p20_ms", "p50_ms", "p80_ms", "gbps", "tflops", "tokens_per_s",
              "copy_gbps", "frac_of_copy", "frac_of_peak_bw", "frac_of_peak_flops", "speedup_vs_eager",
              "speedup_vs_compile", "vs_floor", "above_floor_ms", "saved_mb", "peak_mb", "allocator", "threads")


def suite_modes(quick: bool) -> Tuple[str, ...]:
    """Modes of the ops with a backward: the quick suite times each once, forward + backward
    (its time includes the forward); the full suite also times the forward alone."""
    return ("full",) if quick else ("fwd", "full")


def configure_allocator() -> str:
    """Makes glibc malloc keep freed memory (no mmap for large blocks, no trimming), so freed
    tensors are reused instead of being unmapped and page-faulted again every step. Call once,
    before big tensors are made; returns the setting to record with the results."""
    if platform.libc_ver()[0] != "glibc":
        return "default"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) != 1:
        raise RuntimeError("glibc mallopt rejected M_MMAP_MAX or M_TRIM_THRESHOLD")
    return GLIBC_SETTING


@dataclasses.dataclass(frozen=True)
class Case:
    """One op at one shape/dtype/mode.

    mode: "fwd", "bwd" or "full" (forward + backward).
    bytes: the minimal bytes the op must move (None for ops that are not memory-bound).
    main_bytes: size in bytes of the case's main tensor; the copy reference moves at least this.
    flops: FLOP per call, if meaningful.
    tokens: tokens per call, for model-level steps (rows then give tokens_per_s from p50).
    providers: name -> zero-arg callable doing one call on pre-allocated tensors.
    fp8_providers: providers that compute in FP8 although their names do not say so (an FP8
        recipe over bf16 inputs); held against the FP8 FLOP peak, like ops and providers whose
        names contain "fp8".
    saved_bytes_of: providers whose activation memory (saved_bytes) is measured: training
        steps in eager mode (saved-tensor hooks do not reach inside compiled graphs).
    floors: provider -> the provider that is its floor (the same GEMMs alone, say): its rows
        give vs_floor (time / the floor's, median over rounds) and above_floor_ms (p50 - the
        floor's p50), what sits between the GEMMs.
    bytes_of: provider -> its own minimal bytes where they differ from `bytes` (a decoding step
        over FP8 weights reads half of bf16's).
    """
    op: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    mode: str
    device: torch.device
    bytes: Optional[int]
    main_bytes: int
    providers: Dict[str, Callable[[], object]]
    fp8_providers: Tuple[str, ...] = ()
    flops: Optional[float] = None
    saved_bytes_of: Tuple[str, ...] = ()
    tokens: Optional[int] = None
    floors: Dict[str, str] = dataclasses.field(default_factory=dict)
    bytes_of: Dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Environment:
    """What every row records about the process and machine. peaks: the accelerator's peak
    bandwidth and FLOP/s with their source (None on the CPU); rows hold fractions of them."""
    device: str
    isa: str
    version: str
    torch: str
    git_commit: str
    allocator: str
    threads: int
    peaks: Optional[device_peaks.Peaks] = None


def environment(device: torch.device, allocator: str) -> Environment:
    """isa: the GPU name on CUDA / MUSA, else the active CPU SIMD tier. On an accelerator not in
    device_peaks' table this runs the peak probe (about a second)."""
    info = te.build_info()
    isa = device_peaks.device_name(device) or info["cpu_isa_active"]
    return Environment(device=device.type, isa=isa, version=info["version"], torch=torch.__version__,
                       git_commit=git_commit(), allocator=allocator, threads=torch.get_num_threads(),
                       peaks=device_peaks.peaks_for(device))


def git_commit() -> str:
    """Short hash of HEAD of the checkout holding this file, "unknown" outside one."""
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def copy_provider(case: Case) -> Callable[[], object]:
    """dst.copy_(src) of max(case.main_bytes, MIN_COPY_BYTES) contiguous bytes on the case's device."""
    src = torch.ones(max(case.main_bytes, MIN_COPY_BYTES), dtype=torch.uint8, device=case.device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the distinct storages autograd saves for the backward during one fn() call:
    the activations a training step holds at its peak, plus the parameters (or their FP8
    copies) it saves."""
    storages: Dict[Tuple[int, torch.device], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[(storage.data_ptr(), t.device)] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


class _LiveTensorBytes(TorchDispatchMode):
    """Inside it, the bytes of the storages that ops create, while they live, and their peak.
    A storage is counted once, when an op first returns it (views and in-place results share
    an input's storage and are not new), and leaves the count when it is freed (its Python
    object lives exactly as long as the storage). Allocations inside an op that never leave it
    (a kernel's workspace) are not seen."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.known = set()

    def _freed(self, key, nbytes: int) -> None:
        self.known.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if _has_storage(t)}
        for t in tree_leaves(out):
            if not _has_storage(t):
                continue
            storage = t.untyped_storage()
            key = (storage.data_ptr(), t.device)
            if storage.nbytes() == 0 or key in self.known or key[0] in inputs:
                continue
            self.known.add(key)
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, storage.nbytes())
        return out


def _has_storage(t) -> bool:
    """Whether t is a tensor with a storage of its own: not a wrapper subclass (an FP8 weight,
    QuantizedTensor), whose inner tensors the mode sees in the ops its dispatch runs."""
    return isinstance(t, torch.Tensor) and type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__


def peak_bytes(fn: Callable[[], object]) -> int:
    """The peak of the bytes held by tensors created during one fn() call (outputs,
    temporaries, what autograd saves, gradients): the call's own memory high-water mark above
    what existed before it. Not for compiled providers (their graphs allocate outside the
    Python dispatcher)."""
    with _LiveTensorBytes() as counter:
        fn()
    return counter.peak


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds for one call (including freeing what it returns): wall time on the CPU, device
    events on CUDA / MUSA (device_timing)."""
    return device_timing.timer_for(device)(fn)


def rotated(names: Sequence[str], round_index: int) -> List[str]:
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def time_rounds(providers: Dict[str, Callable[[], object]], device: torch.device, rounds: int,
                warmup: int) -> Dict[str, List[float]]:
    """Seconds per call: name -> one time per round, every provider once per round, rotated."""
    for fn in providers.values():
        for _ in range(warmup):
            fn()
    names = list(providers)
    times: Dict[str, List[float]] = {name: [0.0] * rounds for name in names}
    for r in range(rounds):
        for name in rotated(names, r):
            times[name][r] = time_call(providers[name], device)
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """q in [0, 100], linear interpolation between order statistics."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median over rounds of numerators[r] / denominators[r]."""
    return float(statistics.median(n / d for n, d in zip(numerators, denominators)))


def provider_row(case: Case, name: str, times: Dict[str, List[float]], env: Environment,
                 timestamp: str, saved: Optional[int] = None, peak: Optional[int] = None) -> dict:
    """One result row; `times` in seconds per round, including times[COPY]; `saved`: the
    provider's saved_bytes, if measured."""
    own, copy = times[name], times[COPY]
    copy_moved = 2 * max(case.main_bytes, MIN_COPY_BYTES)  # bytes read + written
    p50 = percentile(own, 50)
    row = dict(op=case.op, provider=name, shape="x".join(map(str, case.shape)),
               dtype=str(case.dtype).removeprefix("torch."), mode=case.mode, timestamp=timestamp,
               p20_ms=1e3 * percentile(own, 20), p50_ms=1e3 * p50, p80_ms=1e3 * percentile(own, 80),
               gbps=None, tflops=None, tokens_per_s=None, copy_gbps=copy_moved / percentile(copy, 50) / 1e9,
               frac_of_copy=None,
               speedup_vs_eager=median_ratio(times[EAGER], own) if EAGER in times else None,
               speedup_vs_compile=median_ratio(times[COMPILE], own) if COMPILE in times else None,
               saved_mb=saved / 1e6 if saved is not None else None, peak_mb=peak / 1e6 if peak is not None else None,
               **dataclasses.asdict(env))
    moved = case.bytes_of.get(name, case.bytes)
    if moved is not None:
        row["gbps"] = moved / p50 / 1e9
        # per round: (moved / own) / (copy_moved / copy)
        row["frac_of_copy"] = moved / copy_moved * median_ratio(copy, own)
    if case.flops is not None:
        row["tflops"] = case.flops / p50 / 1e12
    row.update(peak_fractions(case, name, row["gbps"], row["tflops"], env.peaks))
    if case.tokens is not None:
        row["tokens_per_s"] = case.tokens / p50
    floor = case.floors.get(name)
    row["vs_floor"] = median_ratio(own, times[floor]) if floor is not None else None
    row["above_floor_ms"] = 1e3 * (p50 - percentile(times[floor], 50)) if floor is not None else None
    return {field: row[field] for field in ROW_FIELDS}


def peak_fractions(case: Case, name: str, gbps: Optional[float], tflops: Optional[float],
                   peaks: Optional[device_peaks.Peaks]) -> Dict[str, Optional[float]]:
    """frac_of_peak_bw (achieved / peak GB/s) and frac_of_peak_flops (achieved / peak TFLOP/s
    of the row's dtype, the FP8 peak for FP8 rows); None where a figure is missing (always on
    the CPU, which has no peaks)."""
    fp8 = "fp8" in case.op or "fp8" in name or name in case.fp8_providers
    peak_tflops = peaks.tflops(case.dtype, fp8) if peaks is not None else None
    return dict(frac_of_peak_bw=gbps / peaks.memory_gbps if peaks is not None and gbps is not None else None,
                frac_of_peak_flops=tflops / peak_tflops if peak_tflops is not None and tflops is not None else None)


def run_case(case: Case, env: Environment, rounds: int, warmup: int) -> List[dict]:
    """Times the case's providers and the copy reference interleaved; one row per provider.

    torch._dynamo is reset first so compile providers compile this case from scratch (static
    shapes, no recompile limit carried over from earlier cases). The peak-memory call of each
    uncompiled provider comes first and doubles as one more warm-up call for it."""
    torch._dynamo.reset()
    peaks = {name: peak_bytes(fn) for name, fn in case.providers.items() if COMPILE not in name}
    providers = {**case.providers, COPY: copy_provider(case)}
    times = time_rounds(providers, case.device, rounds, warmup)
    timestamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    saved = {name: saved_bytes(case.providers[name]) for name in case.saved_bytes_of}
    return [provider_row(case, name, times, env, timestamp, saved.get(name), peaks.get(name))
            for name in case.providers]


def geometric_means(rows: Sequence[dict], provider: str = "ours") -> Dict[str, Optional[float]]:
    """Geometric means over `provider`'s rows of its speedups and fraction of copy bandwidth
    (each over the rows that have that figure; None where none has it), and the row count."""
    own = [row for row in rows if row["provider"] == provider]
    means: Dict[str, Optional[float]] = {"rows": len(own)}
    for field in ("speedup_vs_eager", "speedup_vs_compile", "frac_of_copy"):
        values = [row[field] for row in own if row[field] is not None]
        means[field] = math.exp(statistics.fmean(map(math.log, values))) if values else None
    return means


def write_rows(rows: List[dict], out_dir: Path, stem: str) -> Tuple[Path, Path]:
    """Writes out_dir/stem.json (a list of dicts) and out_dir/stem.csv, replacing old ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / f"{stem}.json", out_dir / f"{stem}.csv"
    _replace(json_path, lambda f: json.dump(rows, f, indent=1))
    _replace(csv_path, lambda f: _write_csv(rows, f))
    return json_path, csv_path


def write_summary(summary: Dict[str, dict], out_dir: Path, stem: str) -> Path:
    """Writes out_dir/stem.json: {family: geometric_means(...)}, replacing an old one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.json"
    _replace(path, lambda f: json.dump(summary, f, indent=1))
    return path


def summary_line(means: Dict[str, Optional[float]]) -> str:
    return (f"{means['rows']:>3} rows  {_fmt(means['speedup_vs_eager'], '{:.2f}x')} vs eager  "
            f"{_fmt(means['speedup_vs_compile'], '{:.2f}x')} vs compile  "
            f"{_fmt(means['frac_of_copy'], '{:.0%}')} of copy")


def _write_csv(rows: List[dict], f) -> None:
    writer = csv.DictWriter(f, fieldnames=ROW_FIELDS)
    writer.writeheader()
    writer.writerows(rows)


def _replace(path: Path, write: Callable) -> None:
    """Writes through path.tmp then renames, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        write(f)
    os.replace(tmp, path)


_TABLE_COLUMNS = (("op", 22), ("shape", 14), ("dtype", 8), ("mode", 4), ("provider", 8),
                  ("p50 ms (p20-p80)", 24), ("GB/s", 6), ("% of copy", 9), ("TFLOP/s", 7), ("tok/s", 7),
                  ("x vs eager", 10), ("x vs compile", 12), ("x floor", 7), ("ms > floor", 10), ("copy GB/s", 9),
                  ("saved MB", 8), ("peak MB", 8))
# With device peaks: "% of peak BW" after "% of copy" and "% of peak FLOP" after "TFLOP/s".
_PEAK_COLUMNS = ((8, ("% of peak BW", 12)), (10, ("% of peak FLOP", 14)))


def _with_peaks(items: List, peak_items: Sequence) -> List:
    """items with peak_items inserted at the _PEAK_COLUMNS positions (of the widened table)."""
    items = list(items)
    for (position, _), item in zip(_PEAK_COLUMNS, peak_items):
        items.insert(position, item)
    return items


def _columns(peaks: bool) -> List[Tuple[str, int]]:
    return _with_peaks(_TABLE_COLUMNS, [column for _, column in _PEAK_COLUMNS]) if peaks else list(_TABLE_COLUMNS)


def table_header(peaks: bool = False) -> str:
    """peaks: add the fraction-of-device-peak columns (when the environment has peaks)."""
    return "  ".join(f"{name:<{width}}" for name, width in _columns(peaks))


def table_line(row: dict, peaks: bool = False) -> str:
    """One printed line: ms, GB/s, percent of the same-run copy bandwidth, TFLOP/s, tokens/s,
    speedups (x), time over the floor's (x, and ms above it), that copy bandwidth in GB/s, the
    activation memory saved for backward and the call's peak memory in MB; peaks: also the
    percent of the device's peak bandwidth and FLOP/s."""
    cells = [row["op"], row["shape"], row["dtype"], row["mode"], row["provider"],
             f"{row['p50_ms']:.2f} ({row['p20_ms']:.2f}-{row['p80_ms']:.2f})",
             _fmt(row["gbps"], "{:.1f}"), _fmt(row["frac_of_copy"], "{:.0%}"), _fmt(row["tflops"], "{:.3f}"),
             _fmt(row["tokens_per_s"], "{:.0f}"),
             _fmt(row["speedup_vs_eager"], "{:.2f}x"), _fmt(row["speedup_vs_compile"], "{:.2f}x"),
             _fmt(row.get("vs_floor"), "{:.2f}x"), _fmt(row.get("above_floor_ms"), "{:.1f}"),
             f"{row['copy_gbps']:.1f}", _fmt(row["saved_mb"], "{:.1f}"), _fmt(row["peak_mb"], "{:.1f}")]
    if peaks:
        cells = _with_peaks(cells, [_fmt(row["frac_of_peak_bw"], "{:.0%}"), _fmt(row["frac_of_peak_flops"], "{:.0%}")])
    return "  ".join(f"{cell:<{width}}" for cell, (_, width) in zip(cells, _columns(peaks)))


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else spec.format(value)
