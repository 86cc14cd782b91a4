"""The package imports with a CPU-only torch, says what it is, and its import stays light.

"Light" is checked by what the import loads, not by a stopwatch: a wall-clock bound on a shared
2-core machine fails whenever one of Python's full garbage collections (0.2 s with torch loaded)
happens to fall inside our import. What makes an import slow is loading something heavy, so the
test names what must stay unloaded until first use.
"""
import json
import subprocess
import sys

SCRIPT = """
import json, sys
import torch
before = set(sys.modules)
import transformer_engine.pytorch as te
loaded = sorted(set(sys.modules) - before)
print(json.dumps({"backend": te.build_info()["backends"][0], "loaded": loaded}))
"""

# Optional dependencies (imported lazily, on first use) and torch's compiler stack (imported by
# torch.compile itself): none of them may be loaded by `import transformer_engine.pytorch`.
DEFERRED = ("triton", "transformers", "accelerate", "lightning", "megatron", "matplotlib", "sympy",
            "torch._dynamo", "torch._inductor", "torch.testing", "transformer_engine.bench")


def _import_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_import_is_cpu_first_and_loads_nothing_deferred():
    report = _import_in_a_fresh_process()
    assert report["backend"] == "cpu"
    early = [name for name in report["loaded"]
             if any(name == root or name.startswith(root + ".") for root in DEFERRED)]
    assert not early, f"import transformer_engine.pytorch loaded {early}; import them on first use"


def test_import_loads_only_torch_and_our_own_modules():
    # torch.distributed.nn is loaded on purpose (TE's import makes it available); loading it
    # generates torch's `_remote_module_non_scriptable`.
    roots = {name.split(".")[0] for name in _import_in_a_fresh_process()["loaded"]}
    assert roots <= {"torch", "transformer_engine", "_remote_module_non_scriptable"}, roots
