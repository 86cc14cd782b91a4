"""Compile variants of triton/fp8_cast.py: the casts from bf16 / fp32 / fp16 to both formats,
the transposing cast, and dequantization to bf16 and fp32."""
from transformer_engine.pytorch.triton import fp8_cast as kernels

from . import POINTER


def variants():
    found = []
    for source, target, fp8_max in (("bf16", "e4m3", 448.0), ("fp32", "e5m2", 57344.0), ("fp16", "e4m3", 448.0)):
        signature = {"X": POINTER[source], "SCALE": "*fp32", "Y": POINTER[target], "AMAX_PARTIAL": "*fp32",
                     "n": "i64", "FP8_MAX": "constexpr", "BLOCK": "constexpr"}
        found.append((f"quantize[{source}->{target}]", kernels._quantize_kernel, signature,
                      {"FP8_MAX": fp8_max, "BLOCK": kernels.BLOCK}))
    for target, fp8_max in (("e4m3", 448.0), ("e5m2", 57344.0)):
        signature = {"X": "*bf16", "SCALE": "*fp32", "Y": POINTER[target], "Y_T": POINTER[target],
                     "AMAX_PARTIAL": "*fp32", "n_rows": "i32", "n_cols": "i32", "FP8_MAX": "constexpr",
                     "TILE": "constexpr"}
        found.append((f"quantize_transpose[bf16->{target}]", kernels._quantize_transpose_kernel, signature,
                      {"FP8_MAX": fp8_max, "TILE": kernels.TILE}))
    for source, target in (("e4m3", "bf16"), ("e5m2", "fp32")):
        signature = {"X": POINTER[source], "SCALE_INV": "*fp32", "Y": POINTER[target], "n": "i64",
                     "BLOCK": "constexpr"}
        found.append((f"dequantize[{source}->{target}]", kernels._dequantize_kernel, signature,
                      {"BLOCK": kernels.BLOCK}))
    return found
