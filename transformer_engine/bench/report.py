"""Result files of a te-bench run and reading them back.

JSON (SCHEMA 1):
    {"schema": 1,
     "environment": {"device", "device_name", "isa", "version", "torch", "python", "platform",
                     "git_commit", "timestamp", "allocator", "threads", "peaks", "quick", "command"},
     "rows": [one harness.provider_row dict per (case, provider), fields harness.ROW_FIELDS]}
    device: "cpu" / "cuda" / "musa"; device_name: e.g. "cuda:0"; isa: the active CPU SIMD tier
    or the GPU name; timestamp: UTC ISO 8601 of the run's start; command: the argv list;
    peaks: null on the CPU, else the device peaks the rows' frac_of_peak_bw / frac_of_peak_flops
    divide by: {"source": "spec: NVIDIA H200" or "measured probe", "memory_gbps", "bf16_tflops",
    "fp8_tflops", "fp32_tflops"} (a TFLOP/s figure is null where the device has none).
CSV: header line harness.ROW_FIELDS, one line per row; every row repeats the environment
fields (device, isa, version, torch, git_commit, timestamp, allocator, threads), so the file
stands alone.
"""
import dataclasses
import datetime
import json
import platform
from pathlib import Path
from typing import List, Sequence

import torch

from . import harness

SCHEMA = 1
KEY_FIELDS = ("op", "shape", "dtype", "mode", "provider")


class ResultsError(ValueError):
    """A results file that cannot be read as te-bench output."""


def environment_header(env: harness.Environment, device: torch.device, quick: bool,
                       command: Sequence[str]) -> dict:
    return dict(dataclasses.asdict(env), device_name=str(device), python=platform.python_version(),
                platform=platform.platform(), quick=quick, command=list(command),
                timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def write_json(path: Path, environment: dict, rows: Sequence[dict]) -> None:
    document = {"schema": SCHEMA, "environment": environment, "rows": list(rows)}
    _write(path, lambda f: json.dump(document, f, indent=1))


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    _write(path, lambda f: harness._write_csv(list(rows), f))


def _write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    harness._replace(path, write)


def load_rows(path: Path) -> List[dict]:
    """Rows of a te-bench JSON file: this schema, or the bare row list that
    `python -m transformer_engine.bench --out DIR` writes per family. Raises ResultsError
    naming the file when it is missing or not such a file."""
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ResultsError(f"results file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultsError(f"cannot read results file {path}: {error}") from None
    if isinstance(document, dict):
        if document.get("schema") != SCHEMA:
            raise ResultsError(f"results file {path} has schema {document.get('schema')!r}, expected {SCHEMA}")
        document = document.get("rows")
    if not isinstance(document, list) or not all(
            isinstance(row, dict) and all(field in row for field in (*KEY_FIELDS, "p50_ms")) for row in document):
        raise ResultsError(f"results file {path} has no list of rows with the fields {KEY_FIELDS + ('p50_ms',)}")
    return document
