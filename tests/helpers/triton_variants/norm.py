"""Compile variants of triton/norm.py: the forward (centred or not, bias or not, zero-centred
gamma or not, with a residual, with an FP8 output with or without the high-precision one) and
the backward (with or without a residual's gradient), in bf16, fp32 and fp16."""
from transformer_engine.pytorch.triton import norm as kernels

from . import POINTER

_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _forward(dtype, centered, bias, zero_centered, residual=False, fp8=None, write_output=True):
    data = POINTER[dtype]
    signature = {"X": data, "R": data, "W": data, "B": data, "Y": data, "SUM": data, "MEAN": "*fp32",
                 "RSTD": "*fp32", "SCALE": "*fp32", "Y_FP8": POINTER[fp8] if fp8 else data, "AMAX_PARTIAL": "*fp32",
                 "n_rows": "i32", "n_cols": "i32", "eps": "fp32", "CENTERED": "constexpr",
                 "ZERO_CENTERED_GAMMA": "constexpr", "HAS_BIAS": "constexpr", "HAS_RESIDUAL": "constexpr",
                 "WRITE_OUTPUT": "constexpr", "FP8_MAX": "constexpr", "BLOCK": "constexpr", "ROWS": "constexpr"}
    constexprs = {"CENTERED": centered, "ZERO_CENTERED_GAMMA": zero_centered, "HAS_BIAS": bias,
                  "HAS_RESIDUAL": residual, "WRITE_OUTPUT": write_output, "FP8_MAX": _FP8_MAX.get(fp8, 0.0),
                  "BLOCK": 1024, "ROWS": 4}
    name = f"norm_fwd[{dtype},centered={centered},bias={bias},residual={residual},fp8={fp8},output={write_output}]"
    return name, kernels._norm_fwd_kernel, signature, constexprs


def _backward(dtype, centered, zero_centered, grad_sum=False):
    data = POINTER[dtype]
    signature = {"DY": data, "DSUM": data, "X": data, "MEAN": "*fp32", "RSTD": "*fp32", "W": data, "DX": data,
                 "DW_PARTIAL": "*fp32", "DB_PARTIAL": "*fp32", "n_rows": "i32", "n_cols": "i32",
                 "rows_per_program": "i32", "CENTERED": "constexpr", "ZERO_CENTERED_GAMMA": "constexpr",
                 "HAS_DSUM": "constexpr", "BLOCK": "constexpr"}
    constexprs = {"CENTERED": centered, "ZERO_CENTERED_GAMMA": zero_centered, "HAS_DSUM": grad_sum, "BLOCK": 1024}
    return (f"norm_bwd[{dtype},centered={centered},grad_sum={grad_sum}]", kernels._norm_bwd_kernel, signature,
            constexprs)


def variants():
    found = []
    for dtype, centered, bias, zero_centered in (("bf16", True, True, False), ("bf16", False, False, False),
                                                 ("fp32", True, False, True), ("fp16", False, False, True)):
        found.append(_forward(dtype, centered, bias, zero_centered))
        found.append(_backward(dtype, centered, zero_centered))
    found.append(_forward("bf16", True, True, False, residual=True))
    found.append(_forward("bf16", False, False, False, residual=True))
    found.append(_backward("bf16", True, False, grad_sum=True))
    found.append(_backward("bf16", False, False, grad_sum=True))
    found.append(_forward("bf16", True, True, False, fp8="e4m3", write_output=False))
    found.append(_forward("bf16", False, False, True, fp8="e4m3", write_output=True))
    found.append(_forward("fp32", False, False, False, fp8="e5m2", write_output=False))
    return found
