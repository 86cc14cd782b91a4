"""Compiles Triton kernel variants for sm_90 and sm_100 on a machine without a GPU, pointers
aligned and sizes multiples of 16 as a launch on such tensors is specialised, and prints one
JSON line: per kernel variant and target, the cubin's size, whether the PTX holds float64
arithmetic, its conversions to FP8 (all of which must saturate), its fp32
divisions that are not correctly rounded, its tensor-core matrix instructions and its vector
loads and stores. The variants are those a test file's function lists
(tests/helpers/triton_harness.py), named as <test file>::<function>. Run by triton_harness.py in
a process of its own: the test process runs Triton in its interpreter, which cannot compile.

    python tests/helpers/triton_compile.py tests/ops/test_triton_norm.py::compile_variants
"""
import importlib.util
import json
import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGETS = (90, 100)
_FLOAT64 = re.compile(r"\.f64[\s,;]|cvt(\.\w+)*\.f64")
# cvt{.rnd}{.satfinite}.dtype.atype: the destination type is the second to last part.
_CONVERT = re.compile(r"\bcvt((?:\.\w+)+)\s")
# Vector loads and stores of global memory (16 bytes or 8 at a time per thread).
_VECTOR_ACCESS = re.compile(r"\b(?:ld|st)\.global(?:\.\w+)*\.v[24]\b")
# Tensor-core matrix instructions: Hopper's warpgroup MMA, Blackwell's tcgen05.
_TENSOR_CORE_MMA = re.compile(r"\b(?:wgmma\.mma_async|tcgen05\.mma)\b")
# fp32 divisions that are not correctly rounded (Triton's `/`): scales must use div_rn.
_INEXACT_DIVISION = re.compile(r"\bdiv\.(?:full|approx)(?:\.ftz)?\.f32\b")


def fp8_conversions(ptx: str):
    """(conversions to FP8, of which saturating) in the PTX."""
    to_fp8 = saturating = 0
    for match in _CONVERT.finditer(ptx):
        parts = match.group(1).split(".")[1:]
        if len(parts) >= 2 and parts[-2] in ("e4m3x2", "e5m2x2"):
            to_fp8 += 1
            saturating += "satfinite" in parts
    return to_fp8, saturating


def aligned(kernel, signature):
    """Pointers 16-byte aligned and sizes multiples of 16, as Triton specialises a launch on
    PyTorch's tensors of such sizes: the vectorised code a GPU runs for them (strides are left
    unknown: a unit stride is specialised differently)."""
    return {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in signature.items()
            if kind.startswith("*") or (kind in ("i32", "i64") and not name.startswith("stride"))}


def listed_variants(target: str):
    """The variants of <test file>::<function>: the test file imported as a module of its own
    (this script's folder, tests/helpers, is on sys.path for what it imports)."""
    path, function = target.split("::")
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)()


def main(target: str) -> None:
    report = []
    for name, kernel, signature, constexprs in listed_variants(target):
        for capability in TARGETS:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
                                                attrs=aligned(kernel, signature)),
                                      target=GPUTarget("cuda", capability, 32))
            ptx = compiled.asm["ptx"]
            to_fp8, saturating = fp8_conversions(ptx)
            report.append({"kernel": name, "target": f"sm_{capability}", "cubin_bytes": len(compiled.asm["cubin"]),
                           "float64": bool(_FLOAT64.search(ptx)), "fp8_converts": to_fp8,
                           "fp8_saturating": saturating,
                           "inexact_divisions": len(_INEXACT_DIVISION.findall(ptx)),
                           "tensor_core_mma": len(_TENSOR_CORE_MMA.findall(ptx)),
                           "vector_accesses": len(_VECTOR_ACCESS.findall(ptx))})
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
