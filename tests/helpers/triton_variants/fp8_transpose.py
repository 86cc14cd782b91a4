"""Compile variants of triton/fp8_transpose.py: codes as bytes, read through any strides, and
through rows of unit stride (a launch on a contiguous or column-sliced matrix specialises
stride_col to 1). The stores are 16-byte vectors in both; the loads become so only where the
row stride is known to be a multiple of 16 as well, which the harness leaves unknown."""
from transformer_engine.pytorch.triton import fp8_transpose as kernels

from . import POINTER


def variants():
    found = []
    for name, stride_col in (("strided", "i32"), ("unit_stride_rows", "constexpr")):
        signature = {"X": POINTER["u8"], "Y_T": POINTER["u8"], "n_rows": "i32", "n_cols": "i32", "stride_row": "i32",
                     "stride_col": stride_col, "TILE": "constexpr"}
        constexprs = {"TILE": kernels.TILE, **({"stride_col": 1} if stride_col == "constexpr" else {})}
        found.append((f"transpose[{name}]", kernels._transpose_kernel, signature, constexprs))
    return found
