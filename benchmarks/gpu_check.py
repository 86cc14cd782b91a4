"""The one-call GPU check (make gpu-check): on a machine whose python3 has a CUDA (or MUSA)
PyTorch and Triton, build our extension in place, run the device subset of the tests, then
te-bench on the GPU (the quick suite, the layer steps, FP8 te.Linear at [8192]^3, our flash
attention in Triton against the vendor SDPA at [1, 8192, 16, 128] and FP8 attention), writing
everything under benchmarks/results/<gpu>/. Sized to finish within 8 minutes on an H200.

    python3 benchmarks/gpu_check.py            # refuses with one line where no GPU is present
    python3 benchmarks/gpu_check.py --dry-run  # prints the steps without running them
"""
import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, NamedTuple, Optional

REPO = Path(__file__).resolve().parent.parent
# The device subset: the op tests' GPU backend ("cuda" / "musa" in their ids) and the Triton
# kernel tests, which run on the GPU there instead of in the interpreter.
TEST_SELECTION = ["tests", "-k", "cuda or musa or triton", "-q", "-p", "no:cacheprovider"]


class Step(NamedTuple):
    name: str
    argv: List[str]
    log: str  # file under the results folder that gets the step's output
    seconds: int  # its share of the 8 minutes; a step stopped at it is reported as timed out


def accelerator() -> Optional[str]:
    """"cuda" or "musa" where this python's PyTorch sees a GPU, else None (also without torch)."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "musa") and torch.musa.is_available():
        return "musa"
    return None


def gpu_name(device: str) -> str:
    import torch
    return (torch.cuda if device == "cuda" else torch.musa).get_device_name(0)


def results_folder(name: str) -> Path:
    """benchmarks/results/<gpu>: the device name as a folder name ("NVIDIA H200" -> nvidia_h200)."""
    return REPO / "benchmarks" / "results" / (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu")


def parallel_workers() -> List[str]:
    """pytest-xdist's workers where it is installed: the first runs of the tests are bound by
    Triton compiling each kernel variant, which the machine's cores share out."""
    if importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(min(8, os.cpu_count() or 1))]


def steps(device: str, out: Path) -> List[Step]:
    python = sys.executable
    bench = [python, "-m", "transformer_engine.bench", "run", "--device", device, "--out", str(out)]
    return [
        Step("build", [python, "setup.py", "build_ext", "--inplace"], "build.log", 90),
        Step("tests", [python, "-m", "pytest", *TEST_SELECTION, *parallel_workers(),
                       f"--junitxml={out / 'tests.xml'}"], "tests.log", 140),
        Step("quick suite", [*bench, "--quick", "--json", str(out / "quick.json")], "bench_quick.log", 110),
        Step("layer steps", [*bench, "--family", "layer", "--json", str(out / "layer.json")], "bench_layer.log", 45),
        Step("FP8 te.Linear [8192]^3", [*bench, "--family", "linear", "--shape", "8192x8192x8192",
                                         "--json", str(out / "linear.json")], "bench_linear.log", 45),
        Step("attention", [*bench, "--family", "attention", "--op", "attention_causal_8k", "attention_fp8_causal",
                           "attention_decode_gqa_8k",
                           "--json", str(out / "attention.json")], "bench_attention.log", 45),
    ]


def run(step: Step, out: Path) -> dict:
    start = time.monotonic()
    with open(out / step.log, "w") as log:
        try:
            code = subprocess.run(step.argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=step.seconds).returncode
        except subprocess.TimeoutExpired:
            code = 124  # as timeout(1) reports it; what the step wrote so far stays in its log
    seconds = round(time.monotonic() - start, 1)
    status = "timed out" if code == 124 else f"exit {code}"
    print(f"gpu-check: {step.name}: {status} in {seconds} s (log: {out / step.log})", flush=True)
    return {"step": step.name, "exit": code, "seconds": seconds, "limit_seconds": step.seconds, "log": step.log}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the steps without running them")
    args = parser.parse_args(argv)
    device = accelerator()
    if args.dry_run:
        out = results_folder(gpu_name(device) if device else "<gpu>")
        for step in steps(device or "cuda", out):
            print(f"gpu-check (dry run): {step.name} (at most {step.seconds} s): {' '.join(step.argv)} "
                  f"> {out / step.log}")
        return 0
    if device is None:
        print("gpu-check: no GPU here (this python's torch sees no CUDA or MUSA device); nothing was run")
        return 2
    name = gpu_name(device)
    out = results_folder(name)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for step in steps(device, out):
        results.append(run(step, out))
        if step.name == "build" and results[-1]["exit"]:
            break  # nothing else can run without the extension
    import torch
    import triton
    summary = {"gpu": name, "device": device, "torch": torch.__version__, "triton": triton.__version__,
               "steps": results}
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    return max(result["exit"] for result in results)


if __name__ == "__main__":
    sys.exit(main())
