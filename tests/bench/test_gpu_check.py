"""The one-call GPU check (benchmarks/gpu_check.py, make gpu-check) on a machine without a GPU:
it refuses with one line and runs nothing; its dry run lists the steps it would take, each
within its share of the 8 minutes; the linear family gives a GPU the [8192]^3 case it runs, the
attention family its [1, 8192, 16, 128] one."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_engine.bench import attention_cases, linear_cases

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the check would run")
def test_refuses_with_one_line_without_a_gpu():
    result = run_script()
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == [
        "gpu-check: no GPU here (this python's torch sees no CUDA or MUSA device); nothing was run"]


def test_dry_run_lists_the_steps_within_eight_minutes():
    result = run_script("--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split(":")[1].strip().split(" (")[0] for line in lines] == [
        "build", "tests", "quick suite", "layer steps", "FP8 te.Linear [8192]^3", "attention"]
    seconds = [int(line.split("(at most ")[1].split(" s)")[0]) for line in lines]
    assert sum(seconds) <= 8 * 60
    assert "--device cuda" in lines[2] and "--quick" in lines[2] and "8192x8192x8192" in lines[4]
    assert "benchmarks/results/" in lines[0] and "attention_causal_8k" in lines[5]


def test_accelerators_get_the_fp8_linear_at_8192_cubed(monkeypatch):
    """The linear family's cases for a GPU device (the builder stubbed: no CUDA build here to
    allocate on), against the CPU's seconds-long steps."""
    monkeypatch.setattr(linear_cases, "linear_case", lambda shape, dtype, device: (shape, dtype, device.type))
    gpu = list(linear_cases.cases(False, torch.device("cuda")))
    assert gpu == [((8192, 8192, 8192), torch.bfloat16, "cuda")]
    assert all(shape != (8192, 8192, 8192) for shape, _, _ in linear_cases.cases(False, torch.device("cpu")))
    assert list(linear_cases.cases(True, torch.device("cuda"))) == []  # not in the quick suite


def test_accelerators_get_the_attention_at_8k(monkeypatch):
    monkeypatch.setattr(attention_cases, "attention_case", lambda config, mode, device: (config.name, mode))
    monkeypatch.setattr(attention_cases, "decode_case", lambda config, device: (config.name, "fwd"))
    gpu = list(attention_cases.cases(False, torch.device("cuda")))
    assert ("causal_8k", "full") in gpu
    assert all(name != "causal_8k" for name, _ in attention_cases.cases(False, torch.device("cpu")))
