"""Compiles the Triton kernels of transformer_engine/pytorch/triton/<module>.py for sm_90 and
sm_100 on a machine without a GPU, and prints one JSON line: per kernel variant and target,
the cubin's size and whether the PTX holds float64 arithmetic. Run by the tests in a process
of its own: the test process runs Triton in its interpreter, which cannot compile.

    python tests/triton_compile.py norm
"""
import importlib
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGETS = (90, 100)
_POINTER = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}


def norm_variants():
    """(name, kernel, signature, constexprs) of the norm kernels in the dtypes the ops use."""
    kernels = importlib.import_module("transformer_engine.pytorch.triton.norm")
    variants = []
    for dtype, centered, bias, zero_centered in (("bf16", True, True, False), ("bf16", False, False, False),
                                                 ("fp32", True, False, True), ("fp16", False, False, True)):
        data = _POINTER[dtype]
        signature = {"X": data, "W": data, "B": data, "Y": data, "MEAN": "*fp32", "RSTD": "*fp32",
                     "n_rows": "i32", "n_cols": "i32", "eps": "fp32", "CENTERED": "constexpr",
                     "ZERO_CENTERED_GAMMA": "constexpr", "HAS_BIAS": "constexpr", "BLOCK": "constexpr",
                     "ROWS": "constexpr"}
        constexprs = {"CENTERED": centered, "ZERO_CENTERED_GAMMA": zero_centered, "HAS_BIAS": bias, "BLOCK": 1024,
                      "ROWS": 4}
        variants.append((f"norm_fwd[{dtype},centered={centered},bias={bias}]", kernels._norm_fwd_kernel, signature,
                         constexprs))
        signature = {"DY": data, "X": data, "MEAN": "*fp32", "RSTD": "*fp32", "W": data, "DX": data,
                     "DW_PARTIAL": "*fp32", "DB_PARTIAL": "*fp32", "n_rows": "i32", "n_cols": "i32",
                     "rows_per_program": "i32", "CENTERED": "constexpr", "ZERO_CENTERED_GAMMA": "constexpr",
                     "BLOCK": "constexpr"}
        constexprs = {"CENTERED": centered, "ZERO_CENTERED_GAMMA": zero_centered, "BLOCK": 1024}
        variants.append((f"norm_bwd[{dtype},centered={centered}]", kernels._norm_bwd_kernel, signature, constexprs))
    return variants


def main(module: str) -> None:
    report = []
    for name, kernel, signature, constexprs in {"norm": norm_variants}[module]():
        for capability in TARGETS:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", capability, 32))
            ptx = compiled.asm["ptx"]
            report.append({"kernel": name, "target": f"sm_{capability}", "cubin_bytes": len(compiled.asm["cubin"]),
                           "float64": any(op in ptx for op in (".f64 ", ".f64\t", "cvt.f64", "cvt.rn.f64"))})
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
