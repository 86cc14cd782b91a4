"""Compiles the Triton kernels of transformer_engine/pytorch/triton/<module>.py for sm_90 and
sm_100 on a machine without a GPU, and prints one JSON line: per kernel variant and target, the
cubin's size, whether the PTX holds float64 arithmetic, and its conversions to FP8 (all of
which must saturate). The variants, in the dtypes the ops use, are those of
tests/triton_variants/<module>.py. Run by tests/triton_harness.py in a process of its own: the
test process runs Triton in its interpreter, which cannot compile.

    python tests/triton_compile.py norm
"""
import importlib
import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGETS = (90, 100)
_FLOAT64 = re.compile(r"\.f64[\s,;]|cvt(\.\w+)*\.f64")
# cvt{.rnd}{.satfinite}.dtype.atype: the destination type is the second to last part.
_CONVERT = re.compile(r"\bcvt((?:\.\w+)+)\s")
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


def main(module: str) -> None:
    report = []
    for name, kernel, signature, constexprs in importlib.import_module(f"triton_variants.{module}").variants():
        for capability in TARGETS:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", capability, 32))
            ptx = compiled.asm["ptx"]
            to_fp8, saturating = fp8_conversions(ptx)
            report.append({"kernel": name, "target": f"sm_{capability}", "cubin_bytes": len(compiled.asm["cubin"]),
                           "float64": bool(_FLOAT64.search(ptx)), "fp8_converts": to_fp8,
                           "fp8_saturating": saturating,
                           "inexact_divisions": len(_INEXACT_DIVISION.findall(ptx)),
                           "tensor_core_mma": len(_TENSOR_CORE_MMA.findall(ptx))})
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
