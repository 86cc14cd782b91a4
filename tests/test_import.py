"""The package imports with a CPU-only torch, quickly, and says what it is."""
import subprocess
import sys

SCRIPT = """
import time
start = time.perf_counter()
import torch
after_torch = time.perf_counter()
import transformer_engine.pytorch as te
after_te = time.perf_counter()
assert te.build_info()["backends"][0] == "cpu"
print(after_torch - start, after_te - after_torch)
"""


def test_import_adds_little_to_importing_torch():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    torch_seconds, our_seconds = map(float, out.stdout.split())
    # Our own share of `import transformer_engine.pytorch`: loading the extension, registering
    # fake kernels and autograd rules. torch's own import is outside our control.
    assert our_seconds < 0.5, f"importing transformer_engine.pytorch took {our_seconds:.2f} s after torch"
