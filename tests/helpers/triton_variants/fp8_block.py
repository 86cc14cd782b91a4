"""Compile variants of triton/fp8_block.py: the recipes' block layouts (1x128 and 128x128 with
power-of-two scales, 1x128 fp32 scales, 1x32 and 32x1 E8M0) and dequantization."""
from transformer_engine.pytorch.triton import fp8_block as kernels

from . import POINTER

_LAYOUTS = (((1, 128), "pow2", "bf16", "e4m3"), ((128, 1), "pow2", "bf16", "e4m3"),
            ((128, 128), "pow2", "fp32", "e4m3"), ((1, 128), "fp32", "bf16", "e5m2"), ((1, 32), "e8m0", "bf16", "e4m3"),
            ((32, 1), "e8m0", "fp16", "e4m3"))
_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def variants():
    found = []
    for (block_rows, block_cols), mode, source, target in _LAYOUTS:
        tile_rows, tile_cols = kernels._tile(block_rows, block_cols)
        signature = {"X": POINTER[source], "Y": POINTER[target], "SCALE_INV": "*u8" if mode == "e8m0" else "*fp32",
                     "n_rows": "i32", "n_cols": "i32", "grid_rows": "i32", "grid_cols": "i32", "amax_epsilon": "fp32",
                     "e8m0_reciprocal": "fp32", "FP8_MAX": "constexpr", "MODE": "constexpr",
                     "BLOCK_ROWS": "constexpr", "BLOCK_COLS": "constexpr", "TILE_ROWS": "constexpr",
                     "TILE_COLS": "constexpr"}
        constexprs = {"FP8_MAX": _FP8_MAX[target], "MODE": kernels._MODES[mode], "BLOCK_ROWS": block_rows,
                      "BLOCK_COLS": block_cols, "TILE_ROWS": tile_rows, "TILE_COLS": tile_cols}
        found.append((f"block_quantize[{block_rows}x{block_cols},{mode},{source}->{target}]",
                      kernels._block_quantize_kernel, signature, constexprs))
    for (block_rows, block_cols), e8m0 in (((1, 128), False), ((1, 32), True)):
        tile_rows, tile_cols = kernels._tile(block_rows, block_cols)
        signature = {"X": "*fp8e4nv", "SCALE_INV": "*u8" if e8m0 else "*fp32", "Y": "*bf16", "n_rows": "i32",
                     "n_cols": "i32", "grid_cols": "i32", "E8M0": "constexpr", "BLOCK_ROWS": "constexpr",
                     "BLOCK_COLS": "constexpr", "TILE_ROWS": "constexpr", "TILE_COLS": "constexpr"}
        constexprs = {"E8M0": e8m0, "BLOCK_ROWS": block_rows, "BLOCK_COLS": block_cols, "TILE_ROWS": tile_rows,
                      "TILE_COLS": tile_cols}
        found.append((f"block_dequantize[{block_rows}x{block_cols},e8m0={e8m0}]", kernels._block_dequantize_kernel,
                      signature, constexprs))
    return found
