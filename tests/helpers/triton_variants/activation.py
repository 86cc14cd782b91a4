"""Compile variants of triton/activation.py: the forward of every activation in bf16 (half of
them with a bias), the backward with and without the bias gradient, and the FP8 forward to
e4m3 and e5m2."""
from transformer_engine.pytorch.reference.activation import GATED, PLAIN
from transformer_engine.pytorch.triton import activation as kernels

from . import POINTER


def _forward(activation, dtype, bias, fp8=None):
    data = POINTER[dtype]
    fn, gated = kernels._kind(activation)
    signature = {"X": data, "BIAS": data, "Y": POINTER[fp8 or dtype], "SCALE": "*fp32" if fp8 else data,
                 "AMAX_PARTIAL": "*fp32" if fp8 else data, "n_rows": "i32", "in_cols": "i32", "out_cols": "i32",
                 "limit": "fp32", "alpha": "fp32", "FN": "constexpr", "GATED": "constexpr", "HAS_BIAS": "constexpr",
                 "TO_FP8": "constexpr", "ROWS": "constexpr", "BLOCK_COLS": "constexpr"}
    constexprs = {"FN": fn, "GATED": gated, "HAS_BIAS": bias, "TO_FP8": fp8 is not None, "ROWS": 4,
                  "BLOCK_COLS": 1024}
    name = f"activation_{'fp8' if fp8 else 'fwd'}[{activation},{dtype}{f',{fp8}' if fp8 else ''},bias={bias}]"
    return name, kernels._activation_fwd_kernel, signature, constexprs


def _backward(activation, dtype, bias, dbias):
    data = POINTER[dtype]
    fn, gated = kernels._kind(activation)
    signature = {"DY": data, "X": data, "BIAS": data, "DX": data, "DBIAS_PARTIAL": "*fp32" if dbias else data,
                 "n_rows": "i32", "in_cols": "i32", "out_cols": "i32", "limit": "fp32", "alpha": "fp32",
                 "tiles_per_program": "i32", "FN": "constexpr", "GATED": "constexpr", "HAS_BIAS": "constexpr",
                 "WITH_DBIAS": "constexpr", "ROWS": "constexpr", "BLOCK_COLS": "constexpr"}
    constexprs = {"FN": fn, "GATED": gated, "HAS_BIAS": bias, "WITH_DBIAS": dbias, "ROWS": 4, "BLOCK_COLS": 1024}
    name = f"activation_{'bwd_dbias' if dbias else 'bwd'}[{activation},{dtype},bias={bias}]"
    return name, kernels._activation_bwd_kernel, signature, constexprs


def variants():
    found = [_forward(activation, "bf16", bias=i % 2 == 1) for i, activation in enumerate(PLAIN + GATED)]
    found += [_backward("swiglu", "bf16", bias=False, dbias=False), _backward("gelu", "bf16", bias=True, dbias=True),
              _backward("clamped_swiglu", "fp32", bias=True, dbias=True)]
    found += [_forward("geglu", "bf16", bias=True, fp8="e4m3"), _forward("gelu", "fp16", bias=False, fp8="e5m2")]
    return found
