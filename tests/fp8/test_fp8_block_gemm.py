"""The fp8_block_gemm op (custom_ops/fp8_block_gemm.py): the GEMM of block-scaled FP8 operands on
every backend (the CPU kernel, the Triton kernel in the interpreter or on a GPU) against the
dequantise-then-GEMM reference: every recipe layout, transposed (column-wise)
operands, E4M3 x E5M2, bias, output dtypes, ragged m, n and k, no rows; argument errors;
dispatch; on the CPU, where the scales are powers of two, bit for bit the bf16 GEMM of the values
dequantised to bf16 (within fp32 summation error for a few rows of a, whose k-blocks' sums are
scaled), and the reference itself for other scales;
the kernels' sm_90 / sm_100 builds on the tensor cores (opcheck and torch.compile
of the op: the op cases at the end of tests/fp8/test_fp8_gemm.py)."""
import pytest
import torch

from backends import assert_refused
from numerics import assert_close
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops import _registry, fp8_block
from transformer_engine.pytorch.custom_ops.fp8_block_gemm import fp8_block_gemm
from triton_harness import POINTER, compile_report

ops = torch.ops.portable_te
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# (a's row-wise block, b's row-wise block, scale mode): Float8BlockScaling's 1D x 2D, 1D x 1D, MXFP8.
LAYOUTS = [((1, 128), (128, 128), "pow2"), ((1, 128), (1, 128), "fp32"), ((1, 32), (1, 32), "e8m0")]
LAYOUT_IDS = ["1x128-128x128-pow2", "1x128-1x128-fp32", "1x32-e8m0"]


def operand(x, block, mode, fp8_dtype=E4M3, transposed=False):
    """(codes, scale_inv, block, transposed) of x [rows, k]; transposed: quantised as x^T [k, rows]
    with blocks along its first dimension, as a column-wise copy is."""
    if transposed:
        block = (block[1], block[0])
        data, scale_inv = fp8_block.fp8_block_quantize(x.t().contiguous(), block, fp8_dtype, mode)
    else:
        data, scale_inv = fp8_block.fp8_block_quantize(x, block, fp8_dtype, mode)
    return data, scale_inv, list(block), transposed


def check(device, shape, layout, a_transposed=False, b_transposed=False, a_dtype=E4M3, b_dtype=E4M3, with_bias=True,
          out_dtype=torch.float32):
    m, n, k = shape
    a_block, b_block, mode = layout
    x = torch.randn(m, k, device=device) * torch.logspace(-2, 2, k, device=device)
    w = torch.randn(n, k, device=device) * 0.05
    bias = torch.randn(n, device=device) if with_bias else None
    a = operand(x, a_block, mode, a_dtype, a_transposed)
    b = operand(w, b_block, mode, b_dtype, b_transposed)
    got = fp8_block_gemm(*a, *b, bias, out_dtype)
    want = reference.fp8_block_gemm(*a, *b, bias, out_dtype)
    assert got.shape == (m, n) and got.dtype == out_dtype and got.device == want.device
    # The kernel scales each k-block's fp32 sums; the reference sums dequantised values: the
    # same products, in another order (and, for fp32 scales, rounded at another point).
    scale = want.float().abs().max().item() if want.numel() else 0.0
    tolerance = {"rtol": 2e-5, "atol": 2e-5 * scale} if out_dtype == torch.float32 else {}
    assert_close(got.float(), want.float(), dtype=out_dtype, name="fp8_block_gemm", **tolerance)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", [(128, 128, 256), (150, 200, 320), (1, 16, 40), (0, 64, 128), (70, 0, 64)],
                         ids=str)
def test_matches_the_reference_on_every_backend(backend, layout, shape):
    check(backend.device, shape, layout)


# 128 x 128 blocks serve both usages, so a weight in them is never stored transposed.
TRANSPOSED = [(layout, a_t, b_t) for layout in LAYOUTS for a_t, b_t in ((True, False), (False, True), (True, True))
              if not (b_t and layout[1] == (128, 128))]


@pytest.mark.parametrize("layout, a_transposed, b_transposed", TRANSPOSED,
                         ids=[f"{LAYOUT_IDS[LAYOUTS.index(l)]}-a{int(a)}b{int(b)}" for l, a, b in TRANSPOSED])
def test_transposed_operands(backend, layout, a_transposed, b_transposed):
    """wgrad's and dgrad's operands: column-wise copies read through their strides."""
    check(backend.device, (96, 136, 256), layout, a_transposed, b_transposed)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_outputs_and_mixed_formats(backend, out_dtype):
    check(backend.device, (130, 96, 384), LAYOUTS[0], a_dtype=E5M2, b_dtype=E4M3, out_dtype=out_dtype)
    check(backend.device, (64, 64, 64), LAYOUTS[2], a_dtype=E4M3, b_dtype=E5M2, with_bias=False, out_dtype=out_dtype)


def _operands(k_a=64, k_b=64, block=(1, 32), scale_dtype=torch.uint8):
    a = (torch.zeros(4, k_a, dtype=E4M3), torch.zeros(4, -(-k_a // block[1]), dtype=scale_dtype), list(block), False)
    b = (torch.zeros(8, k_b, dtype=E4M3), torch.zeros(8, -(-k_b // block[1]), dtype=scale_dtype), list(block), False)
    return a, b


@pytest.mark.parametrize("call, words", [
    (lambda: fp8_block_gemm(*_operands(64, 96)[0], *_operands(64, 96)[1], None, torch.float32),
     ["k", "[4, 64]", "[8, 96]"]),
    (lambda: fp8_block_gemm(*_operands()[0], *_operands(scale_dtype=torch.float32)[1], None, torch.float32),
     ["E8M0", "Byte", "Float"]),
    (lambda: fp8_block_gemm(torch.zeros(4, 64), *_operands()[0][1:], *_operands()[1], None, torch.float32),
     ["a_data", "Float"]),
    (lambda: fp8_block_gemm(*_operands()[0], *_operands()[1], torch.zeros(7), torch.float32), ["bias", "[7]", "[8]"]),
    (lambda: fp8_block_gemm(*_operands()[0], torch.zeros(8, 64, dtype=E4M3), torch.zeros(8, 3, dtype=torch.uint8),
                            [1, 32], False, None, torch.float32), ["b_scale_inv", "[8, 3]", "[8, 2]"]),
    (lambda: fp8_block_gemm(*_operands()[0], *_operands()[1], None, torch.int32), ["out_dtype", "Int"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error(backend, call, words):
    assert_refused(backend, call, words)


def test_dispatch_and_build_info():
    triton_path = "triton" if _registry.triton_impls() else "reference"
    assert _registry.op_paths("fp8_block_gemm") == {"cpu": "kernel", "cuda": triton_path, "musa": triton_path}


# (m, n, k): up to 8 rows of a (decoding: b's codes read in place), 9 to 16 (b widened a few rows
# at a time), more (the packed path), ragged k, and an empty product.
CPU_SHAPES = [(1, 200, 384), (3, 61, 200), (7, 64, 256), (9, 40, 130), (16, 96, 320), (17, 130, 256),
              (150, 70, 520), (5, 33, 0)]


# Power-of-two layouts (Float8BlockScaling's, MXFP8's, and a 64 x 32 weight grid), row-wise or
# with one operand column-wise (a 128 x 128 weight is never stored transposed).
CPU_LAYOUTS = [(layout, a_t, b_t) for layout in (LAYOUTS[0], LAYOUTS[2], ((1, 64), (64, 32), "pow2"))
               for a_t, b_t in ((False, False), (True, False), (False, True)) if not (b_t and layout[1][0] == 128)]


@pytest.mark.parametrize("layout, a_transposed, b_transposed", CPU_LAYOUTS,
                         ids=[f"{l[0]}x{l[1]}-{l[2]}-a{int(a)}b{int(b)}" for l, a, b in CPU_LAYOUTS])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=str)
def test_cpu_kernel_equals_the_bf16_gemm_of_the_values(layout, shape, a_transposed, b_transposed):
    """Power-of-two scales: the kernel widens each code times its scale to bf16 as it reads it, so its
    result is, bit for bit, scaled_gemm's of the operands dequantised to bf16 (exact values). With
    at most 8 rows of a (decoding) it reads b's codes in place and scales each k-block's fp32 sums
    instead (TE's order): the same exact products, summed in another order."""
    m, n, k = shape
    x = torch.randn(m, k) * torch.logspace(-2, 2, k)
    w = torch.randn(n, k) * 0.05
    bias = torch.randn(n)
    a = operand(x, layout[0], layout[2], E5M2, a_transposed)
    b = operand(w, layout[1], layout[2], E4M3, b_transposed)

    def values(data, scale_inv, block, transposed):
        dequantized = ops.fp8_block_dequantize(data, scale_inv, block[0], block[1], torch.bfloat16)
        return dequantized.t().contiguous() if transposed else dequantized

    for out_dtype in (torch.float32, torch.bfloat16):
        got = fp8_block_gemm(*a, *b, bias, out_dtype)
        want = ops.scaled_gemm(values(*a), values(*b), None, None, bias, out_dtype)
        if m > 8:
            assert torch.equal(got, want), (layout, shape, out_dtype)
        else:
            scale = want.float().abs().max().item() if want.numel() else 0.0
            tolerance = {"rtol": 2e-5, "atol": 2e-5 * scale} if out_dtype == torch.float32 else {}
            assert_close(got.float(), want.float(), dtype=out_dtype, name="fp8_block_gemm", **tolerance)


def test_cpu_kernel_takes_the_reference_path_for_other_scales():
    """fp32 scales that are not all powers of two, and blocks the kernel cannot index (16 along
    k, 3 rows), run the reference's dequantise-then-fp32-GEMM: its result, bit for bit."""
    x, w, bias = torch.randn(20, 256), torch.randn(40, 256), torch.randn(40)
    cases = [(operand(x, (1, 128), "fp32"), operand(w, (128, 128), "fp32")),
             (operand(x, (1, 16), "pow2"), operand(w, (1, 16), "pow2")),
             (operand(x, (1, 128), "pow2"), operand(w, (3, 128), "pow2"))]
    a, b = operand(x, (1, 128), "pow2"), operand(w, (128, 128), "pow2")
    b_scales = b[1].clone()
    b_scales[0, 0] *= 1.5  # one scale off the powers of two
    cases.append((a, (b[0], b_scales, b[2], b[3])))
    for a, b in cases:
        got = fp8_block_gemm(*a, *b, bias, torch.bfloat16)
        assert torch.equal(got, reference.fp8_block_gemm(*a, *b, bias, torch.bfloat16)), (a[2], b[2])


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/fp8_gemm.py: Float8BlockScaling's 1x128 x 128x128
    (fp32 scales, bias, bf16 out) and 1x128 x 1x128 (E4M3 x E5M2, as a dgrad's), MXFP8's 1x32 x 1x32 (E8M0)."""
    from transformer_engine.pytorch.triton import fp8_gemm as kernels

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


def test_kernels_compile_to_tensor_core_instructions():
    """Float8BlockScaling's and MXFP8's layouts (compile_variants) build for
    sm_90 and sm_100 and multiply on the tensor cores (wgmma / tcgen05), with no float64."""
    pytest.importorskip("triton")
    report = compile_report(compile_variants)
    assert len(report) == 2 * 3
    for entry in report:
        assert entry["cubin_bytes"] > 0 and not entry["float64"] and entry["tensor_core_mma"] > 0, entry
