"""What every Triton kernel test shares: compiling a kernel's variants for sm_90 and sm_100 in a
process of its own (tests/helpers/triton_compile.py) and checking what matters in its PTX.

A test file lists what it compiles in a function of its own, `variants() -> [(name, kernel,
signature, constexprs)]`, in the dtypes and flags the ops launch the kernels with (POINTER gives
the pointer types of the signatures), and hands that function to assert_compiles."""
import inspect
import json
import os
import subprocess
import sys
from typing import Callable, Dict, List

POINTER = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16", "e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "u8": "*u8"}


def compile_report(variants: Callable) -> List[Dict]:
    """tests/helpers/triton_compile.py's report on the kernel variants `variants()` lists (a
    function at the top level of a test file): one entry per variant and target."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "triton_compile.py")
    target = f"{inspect.getfile(variants)}::{variants.__name__}"
    result = subprocess.run([sys.executable, script, target], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_compiles(variants: Callable, count: int, fp8_variants: int = 0, exact_division: bool = False,
                    vectorized: bool = True) -> None:
    """Each of the `count` kernel variants `variants()` lists builds a cubin for both targets with
    no float64 arithmetic; `fp8_variants` of them convert to FP8, and every such conversion
    saturates; with exact_division, every fp32 division is correctly rounded (scales computed as
    the CPU's); with vectorized, every variant moves memory in vector loads or stores (aligned
    tensors)."""
    report = compile_report(variants)
    assert len(report) == 2 * count, [entry["kernel"] for entry in report]
    for entry in report:
        assert entry["cubin_bytes"] > 0, entry
        assert not entry["float64"], entry
        assert entry["fp8_saturating"] == entry["fp8_converts"], entry
        assert not (exact_division and entry["inexact_divisions"]), entry
        assert not vectorized or entry["vector_accesses"] > 0, entry
    assert sum(entry["fp8_converts"] > 0 for entry in report) == 2 * fp8_variants, report
