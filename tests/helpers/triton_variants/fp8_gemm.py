"""Compile variants of triton/fp8_gemm.py: Float8BlockScaling's 1x128 x 128x128 (fp32 scales,
bias, bf16 out) and 1x128 x 1x128 (E4M3 x E5M2, as a dgrad's), MXFP8's 1x32 x 1x32 (E8M0)."""
from transformer_engine.pytorch.triton import fp8_gemm as kernels

from . import POINTER


def variants():
    found = []
    for a_type, b_type, a_rows, b_rows, k_block, e8m0, bias, out in (("e4m3", "e4m3", 1, 128, 128, False, True, "bf16"),
                                                                      ("e5m2", "e4m3", 1, 1, 128, False, False, "bf16"),
                                                                      ("e4m3", "e4m3", 1, 1, 32, True, False, "fp32")):
        scales = "*u8" if e8m0 else "*fp32"
        signature = {"A": POINTER[a_type], "B": POINTER[b_type], "A_SCALE_INV": scales, "B_SCALE_INV": scales,
                     "BIAS": "*bf16", "C": POINTER[out], "m": "i32", "n": "i32", "k": "i32", "stride_am": "i32",
                     "stride_ak": "i32", "stride_bn": "i32", "stride_bk": "i32", "stride_sam": "i32",
                     "stride_sak": "i32", "stride_sbn": "i32", "stride_sbk": "i32", "A_ROWS_PER_SCALE": "constexpr",
                     "B_ROWS_PER_SCALE": "constexpr", "E8M0": "constexpr", "HAS_BIAS": "constexpr",
                     "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
        constexprs = {"A_ROWS_PER_SCALE": a_rows, "B_ROWS_PER_SCALE": b_rows, "E8M0": e8m0, "HAS_BIAS": bias,
                      "BLOCK_M": kernels.BLOCK_M, "BLOCK_N": kernels.BLOCK_N, "BLOCK_K": k_block}
        found.append((f"block_scaled_gemm[{a_type}x{b_type},1x{k_block}/{b_rows}x{k_block},e8m0={e8m0},"
                      f"bias={bias}->{out}]", kernels._block_scaled_gemm_kernel, signature, constexprs))
    return found
