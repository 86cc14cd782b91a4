"""FP8 GEMM paths, all with TransformerEngine's numerics (products of the FP8 codes summed in
fp32, scales and bias applied in fp32, one rounding): the CPU's bf16 kernel (gemm_bf16, on
every SIMD tier) and fp32 path, never torch._scaled_mm there; the accelerator path's
torch._scaled_mm call (operand layout, scales, bias) is checked on the CPU, where _scaled_mm
exists as a slow reference. Also the high-precision GEMM dtypes (fp16 never narrowed to bf16)."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.fp8.codes import Float8Codes
from transformer_engine.pytorch.custom_ops import linear as linear_gemm
from transformer_engine.pytorch.fp8 import gemm
from transformer_engine.pytorch.custom_ops.scaled_gemm import pack_operand, scaled_gemm, scaled_gemm_accumulate
from conftest import CPU_TIERS, GEMM_TIERS
from numerics import assert_close, assert_fp8_gemm_result, assert_value_error_naming, sqnr_db
from op_cases import BF16, F32, OpCases, basic_inputs, dtype_name, randn

ops = torch.ops.portable_te


def quantized(shape, fp8_dtype, amax_target):
    x = torch.randn(shape)
    scale = torch.tensor([amax_target]) / x.abs().amax()
    return Float8Codes.quantize(x, scale, fp8_dtype)[0], x


@pytest.mark.parametrize("b_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_mm_call_equals_the_dequantised_product(b_dtype, out_dtype):
    a, _ = quantized((32, 64), torch.float8_e4m3fn, 400.0)
    b, _ = quantized((48, 64), b_dtype, 50000.0 if b_dtype == torch.float8_e5m2 else 400.0)
    bias = torch.randn(48)
    got = gemm.scaled_mm(a, b, out_dtype, bias)
    assert got.dtype == out_dtype and got.shape == (32, 48)
    assert_fp8_gemm_result(got, a.dequantize(), b.dequantize(), bias, name="scaled_mm")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_cpu_path_is_te_numerics_and_never_calls_scaled_mm(monkeypatch, cpu_gemm, out_dtype):
    a, x = quantized((32, 64), torch.float8_e4m3fn, 400.0)
    b, w = quantized((16, 64), torch.float8_e4m3fn, 400.0)
    bias = torch.randn(16) * 0.1
    assert not gemm._scaled_mm_applies(a, b)
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kwargs: pytest.fail("_scaled_mm called on CPU"))
    y = gemm.fp8_gemm(a, b, out_dtype, bias)
    assert y.dtype == out_dtype
    assert_fp8_gemm_result(y, a.dequantize(), b.dequantize(), bias)
    assert sqnr_db(x @ w.t() + bias, y) >= 25


def test_zero_input_gives_the_bias_exactly(cpu_gemm):
    """The issue's symptom: with bf16 sums and a bf16 bias, every element of an fp32 Linear's
    output under FP8 differed from its bias (by up to 4.6e-4 for a bias of about 0.1)."""
    m = te.Linear(64, 48)
    with torch.no_grad():
        m.bias.copy_(torch.rand(48) * 0.2)
    for rec in (recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(),
                recipe.MXFP8BlockScaling()):
        with te.autocast(recipe=rec):
            y = m(torch.zeros(8, 64))
        assert torch.equal(y, m.bias.detach().expand(8, 48)), type(rec).__name__


def test_scaled_mm_needs_multiples_of_16_and_an_e4m3_operand(monkeypatch):
    monkeypatch.setattr(gemm, "_SCALED_MM_DEVICES", {"cpu"})  # as if the CPU had the FP8 GEMM
    e5m2_a, _ = quantized((32, 64), torch.float8_e5m2, 50000.0)
    e5m2_b, _ = quantized((16, 64), torch.float8_e5m2, 50000.0)
    e4m3_b, _ = quantized((16, 64), torch.float8_e4m3fn, 400.0)
    odd, _ = quantized((30, 64), torch.float8_e4m3fn, 400.0)
    assert gemm._scaled_mm_applies(e5m2_a, e4m3_b)
    assert not gemm._scaled_mm_applies(e5m2_a, e5m2_b)
    assert not gemm._scaled_mm_applies(odd, e4m3_b)


# --- scaled_gemm: the bf16 GEMM kernel (fp32 sums, fused epilogue) and the fp32 path ---------

GEMM_SHAPES = [(1, 1, 1), (1, 70, 1100), (2, 13, 200), (37, 45, 71), (13, 33, 301), (100, 600, 40), (25, 70, 2),
               (230, 530, 1100)]


def operands(m, n, k, dtype=torch.bfloat16):
    return torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_bf16_kernel_is_the_exact_product_rounded_once_on_every_tier(gemm_tier, shape, out_dtype, with_bias):
    m, n, k = shape
    a, b = operands(m, n, k)
    a_scale_inv, b_scale_inv = torch.tensor([0.375]), torch.tensor([1.0 / 3])
    bias = torch.randn(n) if with_bias else None
    got = scaled_gemm(a, b, a_scale_inv, b_scale_inv, bias, out_dtype)
    assert got.dtype == out_dtype and got.shape == (m, n)
    alpha = (a_scale_inv * b_scale_inv).double()  # the fp32 product the op applies
    assert_fp8_gemm_result(got, a.double() * alpha, b, bias)
    assert_close(got, reference.scaled_gemm(a, b, a_scale_inv, b_scale_inv, bias, out_dtype), dtype=out_dtype)


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
CODE_FORMATS = [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2), (E4M3, torch.bfloat16), (torch.bfloat16, E5M2)]


def codes(rows, cols, dtype):
    """FP8 codes (or bf16 values) spread over the format's range, subnormals included."""
    return (torch.randn(rows, cols) * (30.0 if dtype == E4M3 else 3000.0)).to(dtype)


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("formats", CODE_FORMATS, ids=lambda f: f"{f[0]}-{f[1]}".replace("torch.", ""))
def test_fp8_codes_are_widened_inside_the_kernel_exactly(gemm_tier, shape, formats):
    """The codes themselves go in (no widened copy): the same bits as their bf16 values through
    the same kernel, and TE's FP8 GEMM of the dequantised operands."""
    m, n, k = shape
    a, b = codes(m, k, formats[0]), codes(n, k, formats[1])
    a_scale_inv, b_scale_inv, bias = torch.tensor([0.375]), torch.tensor([1.0 / 3]), torch.randn(n)
    got = scaled_gemm(a, b, a_scale_inv, b_scale_inv, bias, torch.float32)
    assert torch.equal(got, scaled_gemm(a.bfloat16(), b.bfloat16(), a_scale_inv, b_scale_inv, bias, torch.float32))
    alpha = (a_scale_inv * b_scale_inv).double()
    assert_fp8_gemm_result(got, a.double() * alpha, b.double(), bias)


@pytest.mark.parametrize("k", [64, 100, 4096, 4099])
@pytest.mark.parametrize("block", [None, (1, 128), (128, 128), (1, 64), (1, 32)], ids=str)
def test_one_and_two_rows_sum_as_more_rows_do(gemm_tier, k, block):
    """Decoding's one or two rows of a read FP8 b 64 codes at a time on CPUs with AVX512-VBMI
    (gemm_avx512.cpp: in_place_block_vbmi), in the order of the path that takes more rows: each
    output bit for bit the same as that row's in a GEMM of three rows, per-tensor codes and
    power-of-two blocks alike, k a multiple of 64 or not."""
    a, b = torch.randn(3, k, dtype=torch.bfloat16), torch.randn(70, k) * 0.05
    if block is None:
        b_codes = b.to(E4M3)
        gemm = lambda rows: scaled_gemm(rows.to(E4M3), b_codes, None, None, None, torch.bfloat16)  # noqa: E731
    else:
        b_codes, b_scales = torch.ops.portable_te.fp8_block_quantize(b, *block, E4M3, "pow2", 0.0)

        def gemm(rows):
            a_codes, a_scales = torch.ops.portable_te.fp8_block_quantize(rows.float(), 1, block[1], E4M3, "pow2", 0.0)
            return torch.ops.portable_te.fp8_block_gemm(a_codes, a_scales, [1, block[1]], False, b_codes, b_scales,
                                                        list(block), False, None, torch.bfloat16)
    three = gemm(a)
    for rows in (1, 2):
        assert torch.equal(gemm(a[:rows]), three[:rows]), rows


@pytest.mark.parametrize("b_dtype", [E4M3, E5M2, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k", [16, 4099])
def test_each_of_up_to_16_rows_sums_as_it_does_alone(gemm_tier, b_dtype, k):
    """Decoding's rows of a (up to 16) read b in place, on the FMA tiers too (gemm_few_rows_fma.h:
    b widened in registers, or for more than 4 rows once into a staging row): each row's outputs
    the same bits as that row's GEMM alone, whatever the rows beside it, for every count of rows
    and of columns of b (n = 7: the last block of columns short), k a multiple of the step or not;
    and TE's numerics."""
    a, b = codes(16, k, E4M3), codes(7, k, b_dtype)
    bias, scale_inv = torch.randn(7), torch.tensor([0.375])
    for rows in (16, 5, 4, 3, 2):
        got = scaled_gemm(a[:rows], b, scale_inv, None, bias, torch.float32)
        for row in range(rows):
            assert torch.equal(got[row], scaled_gemm(a[row:row + 1], b, scale_inv, None, bias, torch.float32)[0])
        assert_fp8_gemm_result(got, a[:rows].double() * 0.375, b.double(), bias)


def normal_e4m3_codes(rows, cols):
    """E4M3 codes of normal numbers only (exponent 1 to 15, no NaN), either sign, the extremes included."""
    magnitudes = torch.randint(0x08, 0x7F, (rows, cols), dtype=torch.uint8)
    magnitudes.view(-1)[:4] = torch.tensor([0x08, 0x7E, 0x08, 0x7E], dtype=torch.uint8)  # 2^-6 and 448
    signs = torch.randint(0, 2, (rows, cols), dtype=torch.uint8) << 7
    return (magnitudes | signs).view(E4M3)


@pytest.mark.parametrize("odd_code", [0x00, 0x80, 0x01, 0x87, 0x7F, 0xFF], ids=hex)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_each_run_of_e4m3_codes_with_a_zero_subnormal_or_nan_sums_as_the_others(gemm_tier, odd_code, rows):
    """Decoding's E4M3 b is widened 32 codes at a time on AVX2 (few_rows_widen_avx2.h): a run of
    normal codes by integer instructions, a run holding a zero, subnormal or NaN code through
    F16C. With one such code at each place of the first two runs of a row of b (row j at place
    j) and none in the rows after, k not a whole number of runs: the same bits as b's bf16
    values through the same kernel (no NaN: either route gives each code its exact value), and
    TE's numerics; a NaN code makes exactly its row of b's outputs NaN. One and two rows of a
    read b in place, five read the staged fp32 rows."""
    k, n = 4096 + 16 + 5, 70
    a, b = codes(rows, k, E4M3), normal_e4m3_codes(n, k)
    for j in range(64):
        b.view(torch.uint8)[j, j] = odd_code
    scale_inv, bias = torch.tensor([0.375]), torch.randn(n)
    got = scaled_gemm(a, b, scale_inv, None, bias, torch.float32)
    if odd_code & 0x7F == 0x7F:
        want = torch.zeros(rows, n, dtype=torch.bool)
        want[:, :64] = True
        assert torch.equal(torch.isnan(got), want)
        got, a, b, bias = got[:, 64:], a, b[64:], bias[64:]
    else:
        assert torch.equal(got, scaled_gemm(a, b.bfloat16(), scale_inv, None, bias, torch.float32))
    assert_fp8_gemm_result(got, a.double() * 0.375, b.double(), bias)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("block", [(1, 32), (128, 128)], ids=str)
def test_block_scaled_runs_of_e4m3_codes_sum_as_their_dequantised_values(gemm_tier, block, rows):
    """The same two routes under block scales (MXFP8's 1 x 32 and 128 x 128), b read in place
    (one row of a) or staged as its values (five): whichever route each run of 32 codes took,
    TE's numerics of the dequantised operands."""
    k, n = 512, 40
    a = torch.randn(rows, k) * 0.1
    b = normal_e4m3_codes(n, k)
    b.view(torch.uint8)[:, 40] = 0  # a zero in the second run of every row
    b.view(torch.uint8)[3, 100:104] = 0x02  # subnormals in a run of row 3
    ops = torch.ops.portable_te
    b_scales = ops.fp8_block_quantize(torch.randn(n, k), *block, E4M3, "pow2", 0.0)[1]
    a_codes, a_scales = ops.fp8_block_quantize(a, 1, block[1], E4M3, "pow2", 0.0)
    got = ops.fp8_block_gemm(a_codes, a_scales, [1, block[1]], False, b, b_scales, list(block), False, None,
                             torch.float32)
    b_values = b.float() * b_scales.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    a_values = a_codes.float() * a_scales.float().repeat_interleave(block[1], 1)[:, :k]
    assert_fp8_gemm_result(got, a_values.double(), b_values.double())


@pytest.mark.parametrize("rows", [1, 5])
def test_bf16_rows_too_large_to_scale_keep_their_products(gemm_tier, rows):
    """E4M3 codes of b read in place come as their values times 2^-8 on AVX2, and a times 2^8 makes
    each product exact again; a bf16 value of a at 2^120 or more would overflow there, so b is
    then staged as its values: products of 2^126 by codes below 1 stay finite and exact."""
    a = torch.randn(rows, 96, dtype=torch.bfloat16)
    a[0, 7] = 2.0 ** 126
    b = (torch.rand(6, 96) * 0.9 + 0.05).to(E4M3)
    got = scaled_gemm(a, b, None, None, None, torch.float32)
    assert torch.isfinite(got).all()
    assert_fp8_gemm_result(got, a.double(), b.double())


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=str)
def test_subnormal_codes_of_b_survive_flush_to_zero(gemm_tier, fp8_dtype):
    """With torch.set_flush_denormal(True) (the x86 DAZ and FTZ modes), decoding's in-place
    widening still reads b's subnormal codes as their values: no fp32 subnormal is formed from
    them (F16C converts fp16 subnormals to normal fp32). Few enough columns that the caller's
    thread, whose mode is set, runs the whole GEMM."""
    smallest = torch.finfo(fp8_dtype).smallest_normal
    b = (torch.rand(8, 64) * smallest).to(fp8_dtype)  # subnormal codes (and zeros)
    assert (b.view(torch.uint8) & 0x7F).gt(0).any()
    a = torch.ones(1, 64, dtype=torch.bfloat16)
    want = b.double().sum(dim=1).float()[None]
    assert torch.set_flush_denormal(True)  # x86-64 always has the modes
    try:
        got = scaled_gemm(a, b, None, None, None, torch.float32)
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("rows", [1, 70])
def test_nan_codes_of_b_reach_their_column(gemm_tier, fp8_dtype, rows):
    a, b = codes(rows, 300, fp8_dtype), codes(40, 300, fp8_dtype)
    b.view(torch.uint8)[5, 150] = 0x7F  # NaN in both formats
    nan = torch.isnan(scaled_gemm(a, b, None, None, None, torch.float32))
    want = torch.zeros(rows, 40, dtype=torch.bool)
    want[:, 5] = True
    assert torch.equal(nan, want)


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=str)
def test_nan_codes_reach_exactly_their_row_and_column(gemm_tier, fp8_dtype):
    a, b = codes(70, 300, fp8_dtype), codes(40, 300, fp8_dtype)
    a.view(torch.uint8)[2, 299] = 0x7F  # NaN in both formats
    b.view(torch.uint8)[1, 150] = 0xFF
    nan = torch.isnan(scaled_gemm(a, b, None, None, None, torch.float32))
    want = torch.zeros(70, 40, dtype=torch.bool)
    want[2, :], want[:, 1] = True, True
    assert torch.equal(nan, want)


def test_cpu_fp8_gemm_hands_the_codes_to_the_kernel(monkeypatch):
    """With bf16 sums, per-tensor operands are not dequantised first: the kernel widens them."""
    previous = linear_gemm.set_cpu_gemm_dtype(torch.bfloat16)
    try:
        a, _ = quantized((40, 64), torch.float8_e4m3fn, 400.0)
        b, _ = quantized((24, 64), torch.float8_e5m2, 50000.0)
        monkeypatch.setattr(gemm, "fp8_dequantize", lambda *args: pytest.fail("codes widened outside the kernel"))
        y = gemm.fp8_gemm(a, b, torch.bfloat16)
        assert_fp8_gemm_result(y, a.dequantize(), b.dequantize())
    finally:
        linear_gemm.set_cpu_gemm_dtype(previous)


@pytest.mark.parametrize("rows", [1, 16, 17, 200])
def test_codes_go_to_the_kernel_whatever_the_cpu_gemm_dtype(monkeypatch, cpu_gemm, rows):
    """With fp32 GEMMs (CPUs without bf16 matrix units) as with bf16 ones, per-tensor codes and
    power-of-two blocks go to our kernel as they are, whatever the rows: it widens them as it
    reads them, where ATen's fp32 GEMM would need both operands dequantised first. Blocks whose
    scales are not powers of two are not exact in bf16: they are dequantised (to fp32 for the fp32
    GEMM). TE's numerics either way."""
    from transformer_engine.pytorch.fp8.block_tensor import Float8BlockTensor
    a, _ = quantized((rows, 64), E4M3, 400.0)
    b, _ = quantized((24, 64), E4M3, 400.0)
    dequantised = []
    original = gemm.fp8_dequantize
    monkeypatch.setattr(gemm, "fp8_dequantize", lambda *args: dequantised.append(1) or original(*args))
    assert_fp8_gemm_result(gemm.fp8_gemm(a, b, torch.float32), a.dequantize(), b.dequantize())
    assert not dequantised
    for scales, exact in (("pow2", True), ("fp32", False)):
        a_blocks = Float8BlockTensor.quantize(torch.randn(rows, 256), (1, 128), E4M3, scales)
        b_blocks = Float8BlockTensor.quantize(torch.randn(24, 256), (128, 128), E4M3, scales)
        assert gemm._bf16_sums(a_blocks, b_blocks) == exact
        assert_fp8_gemm_result(gemm.fp8_gemm(a_blocks, b_blocks, torch.float32), a_blocks.dequantize(),
                               b_blocks.dequantize())


@pytest.mark.skipif("amx" not in GEMM_TIERS, reason=f"the CPU has no AMX-BF16 tiles the OS grants "
                    f"(tier {GEMM_TIERS[-1]}): the tiles are tested where lscpu shows amx_bf16")
def test_amx_tiles_agree_with_the_dot_products():
    """The tiles sum each 32 values of k in their own order (gemm_amx.cpp), for few rows of a
    (b read in place) and many: within fp32 summation error of the dot products, not equal."""
    from transformer_engine import _kernels
    for m in (16, 230):
        a, b = codes(m, 1100, E4M3), codes(530, 1100, E5M2)
        results = {}
        for tier in ("amx", "avx512"):
            previous = _kernels.limit_cpu_isa(tier)
            try:
                results[tier] = scaled_gemm(a, b, None, None, None, torch.float32)
            finally:
                _kernels.limit_cpu_isa(previous)
        assert not torch.equal(results["amx"], results["avx512"])  # the other order does show
        assert_fp8_gemm_result(results["amx"], a, b)
        assert_fp8_gemm_result(results["avx512"], a, b)


@pytest.mark.parametrize("b_dtype", [E4M3, E5M2, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [5, 230], ids=lambda m: f"m{m}")
def test_b_packed_ahead_gives_the_same_bits(gemm_tier, b_dtype, m):
    """pack_operand(b) once, then GEMMs that skip packing b: the bits of b packed in each call.
    With 230 rows (more than any in-place path takes) the packed copy is what is read."""
    a, b = codes(m, 300, E4M3), codes(70, 300, b_dtype)
    bias, scale_inv = torch.randn(70), torch.tensor([0.5])
    want = scaled_gemm(a, b, scale_inv, None, bias, torch.bfloat16)
    packed = pack_operand(b)
    assert packed.dtype == torch.uint8 and packed.dim() == 1
    assert torch.equal(scaled_gemm(a, b, scale_inv, None, bias, torch.bfloat16, packed), want)
    if m > 32:
        assert not torch.equal(scaled_gemm(a, torch.zeros_like(b), scale_inv, None, bias, torch.bfloat16, packed),
                               scaled_gemm(a, torch.zeros_like(b), scale_inv, None, bias, torch.bfloat16))


def test_b_packed_for_another_shape_or_tier_is_refused():
    from transformer_engine import _kernels
    a, b = codes(40, 64, E4M3), codes(24, 64, E4M3)
    packed = pack_operand(b)
    assert_value_error_naming(lambda: scaled_gemm(a, codes(25, 64, E4M3), None, None, None, torch.float32, packed),
                              ["b_packed", "[25, 64]"])
    assert_value_error_naming(lambda: scaled_gemm(a, b, None, None, None, torch.float32, packed[:-1]),
                              ["b_packed", "bytes"])
    assert_value_error_naming(lambda: scaled_gemm(a.float(), b.float(), None, None, None, torch.float32, packed),
                              ["b_packed", "fp32"])
    forged = packed.clone()
    forged[:8] = 0  # no header
    assert_value_error_naming(lambda: scaled_gemm(a, b, None, None, None, torch.float32, forged),
                              ["b_packed", "pack it again"])
    assert_value_error_naming(lambda: pack_operand(b.float()), ["gemm_pack_b", "Float"])
    if len(GEMM_TIERS) > 1:
        previous = _kernels.limit_cpu_isa(GEMM_TIERS[-2])
        try:
            with pytest.raises(ValueError, match="active CPU tier"):
                scaled_gemm(a, b, None, None, None, torch.float32, packed)
        finally:
            _kernels.limit_cpu_isa(previous)


def test_a_weight_kept_across_microbatches_is_packed_once(monkeypatch, cpu_gemm):
    """is_first_microbatch: the FP8 weight cast for the first microbatch is packed for the CPU
    kernel once, whatever the CPU's GEMM dtype (the kernel takes FP8 codes on every CPU), and the
    later microbatches' forward GEMMs reuse that packing, with the bits of the same microbatches
    run without it."""
    from transformer_engine.pytorch.fp8 import codes as codes_module
    layer = te.Linear(64, 80, params_dtype=torch.bfloat16)
    xs = [torch.randn(48, 64, dtype=torch.bfloat16) for _ in range(3)]
    rec = recipe.Float8CurrentScaling()  # no state carried from one run to the next

    def microbatches():
        with torch.no_grad(), te.autocast(recipe=rec):
            return [layer(x, is_first_microbatch=i == 0) for i, x in enumerate(xs)]

    calls = []
    monkeypatch.setattr(codes_module, "pack_operand", lambda b: calls.append(b.shape) or pack_operand(b))
    packed = microbatches()
    assert calls == [torch.Size([80, 64])]
    monkeypatch.setattr(codes_module.Float8Codes, "packed_for_cpu_gemm", lambda self: None)
    unpacked = microbatches()
    assert all(torch.equal(p, u) for p, u in zip(packed, unpacked))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("formats", [(E4M3, E5M2), (torch.bfloat16, torch.bfloat16)],
                         ids=lambda f: f"{f[0]}-{f[1]}".replace("torch.", ""))
@pytest.mark.parametrize("shape", [(9, 40, 70), (230, 530, 300)], ids=str)
def test_accumulate_adds_out_before_the_one_rounding(gemm_tier, out_dtype, formats, shape):
    """out += the scaled product in place: out's values join the fp32 sum before one rounding
    (TE's GEMM with accumulate=True), on the strided rows of a wider buffer too."""
    m, n, k = shape
    a, b = codes(m, k, formats[0]), codes(n, k, formats[1])
    a_scale_inv = torch.tensor([2.0 ** -14])  # the sums within fp16's range
    wide = (torch.randn(m, n + 7) * 100).to(out_dtype)
    wide_before = wide.clone()
    out = wide[:, 3:3 + n]
    scaled_gemm_accumulate(a, b, a_scale_inv, None, out)
    assert_fp8_gemm_result(out, a.double() * 2.0 ** -14, b.double(), wide_before[:, 3:3 + n].double())
    assert torch.equal(wide[:, :3], wide_before[:, :3]) and torch.equal(wide[:, 3 + n:], wide_before[:, 3 + n:])


def test_accumulate_of_fp32_operands_and_bad_outputs():
    a, b = operands(12, 20, 33, torch.float32)
    out = torch.randn(12, 20)
    before = out.clone()
    scaled_gemm_accumulate(a, b, None, torch.tensor([2.0]), out)
    assert_fp8_gemm_result(out, a, b * 2, before)
    bf16_a, bf16_b = a.bfloat16(), b.bfloat16()
    assert_value_error_naming(lambda: scaled_gemm_accumulate(bf16_a, bf16_b, None, None, torch.zeros(12, 21)),
                              ["out", "[12, 20]", "[12, 21]"])
    assert_value_error_naming(lambda: scaled_gemm_accumulate(bf16_a, bf16_b, None, None, torch.zeros(20, 12).t()),
                              ["out", "contiguous rows"])
    assert_value_error_naming(lambda: scaled_gemm_accumulate(bf16_a, bf16_b, None, None,
                                                             torch.zeros(12, 20, dtype=torch.float64)), ["out"])
    shared = torch.zeros(12, 33, dtype=torch.bfloat16)
    assert_value_error_naming(lambda: scaled_gemm_accumulate(shared, bf16_b, None, None, shared[:, :20]),
                              ["out", "share memory"])


def test_fp8_gemm_accumulate_adds_into_out(cpu_gemm):
    a, _ = quantized((48, 64), torch.float8_e5m2, 50000.0)
    b, _ = quantized((40, 64), torch.float8_e4m3fn, 400.0)
    out = torch.randn(48, 40) * 1000
    before = out.clone()
    gemm.fp8_gemm_accumulate(a, b, out)
    assert_fp8_gemm_result(out, a.dequantize(), b.dequantize(), before)


@pytest.mark.parametrize("fp8_recipe", [None, recipe.DelayedScaling(), recipe.Float8CurrentScaling()],
                         ids=["bf16", "delayed", "current"])
def test_weight_gradient_is_added_into_main_grad_before_rounding(cpu_gemm, fp8_recipe):
    """fuse_wgrad_accumulation: main_grad += dy^T x with the GEMM's fp32 sums added to main_grad
    in fp32, never the gradient rounded to the weight's bf16 first (TE adds it in its GEMM)."""
    layer = te.Linear(64, 48, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
    layer.weight.main_grad = torch.randn(48, 64) * 1000  # large: a bf16-rounded gradient would show
    before = layer.weight.main_grad.clone()
    x = torch.randn(40, 64, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(40, 48, dtype=torch.bfloat16)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        y = layer(x)
    y.backward(dy)
    assert layer.weight.grad is None
    if fp8_recipe is None:
        assert_fp8_gemm_result(layer.weight.main_grad, dy.t(), x.detach().t(), before)
    else:  # the product of the FP8 casts of dy and x: within their quantisation error
        exact = before.double() + dy.double().t() @ x.detach().double()
        assert sqnr_db(exact - before.double(), layer.weight.main_grad.double() - before.double()) >= 20


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp32_operands_use_the_fp32_gemm_with_the_same_epilogue(out_dtype):
    a, b = operands(37, 45, 71, torch.float32)
    bias = torch.randn(45, dtype=torch.bfloat16)  # added in fp32, whatever its dtype
    got = scaled_gemm(a, b, torch.tensor([0.5]), None, bias, out_dtype)
    assert_fp8_gemm_result(got, a * 0.5, b, bias)


def test_fp32_operands_are_not_narrowed_by_torch_autocast():
    a, b = operands(16, 24, 64, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = scaled_gemm(a, b, None, None, None, torch.float32)
    assert_fp8_gemm_result(got, a, b)


def test_fma_tiers_sum_in_the_same_order():
    """portable and avx2 run the same fp32 FMA sequence (odd k of each pair first, like the
    AVX512-BF16 dot product): their results are equal bit for bit."""
    from transformer_engine import _kernels
    a, b = operands(29, 70, 513)
    results = []
    for tier in [t for t in ("portable", "avx2") if t in CPU_TIERS]:
        previous = _kernels.limit_cpu_isa(tier)
        try:
            results.append(scaled_gemm(a, b, None, None, None, torch.float32))
        finally:
            _kernels.limit_cpu_isa(previous)
    assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(0, 5, 3), (5, 0, 3), (4, 6, 0)], ids=str)
def test_empty_sizes(shape, dtype):
    m, n, k = shape
    a, b = operands(m, n, k, dtype)
    got = scaled_gemm(a, b, None, None, torch.full((n,), 0.5), torch.float32)
    assert torch.equal(got, torch.full((m, n), 0.5))


def test_strided_operands():
    wide = torch.randn(40, 100).bfloat16()
    a = wide[:, 10:77]  # rows 100 apart
    b = torch.randn(67, 30).bfloat16().t()  # [30, 67], columns contiguous
    got = scaled_gemm(a, b, None, None, None, torch.float32)
    assert_fp8_gemm_result(got, a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_broadcast_and_single_row_operands(dtype):
    """Row stride 0 (an expanded row) and odd strides of one-row views are not read as rows."""
    row = torch.randn(1, 40).to(dtype)
    a, b = row.expand(7, 40), torch.randn(5, 40).to(dtype)
    assert_fp8_gemm_result(scaled_gemm(a, b, None, None, None, torch.float32), a, b)
    assert_fp8_gemm_result(scaled_gemm(b, a, None, None, None, torch.float32), b, a)
    column = torch.randn(40, 3).to(dtype)[:, 1:2].t()  # [1, 40], stride (1, 3)
    assert_fp8_gemm_result(scaled_gemm(column, b, None, None, None, torch.float32), column, b)


def test_nan_and_inf_propagate():
    a, b = operands(3, 40, 9)
    a[0, 4], a[1, 2] = float("nan"), float("inf")
    got = scaled_gemm(a, b, None, None, None, torch.float32)
    want = reference.scaled_gemm(a, b, None, None, None, torch.float32)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))


def test_bad_input_names_the_argument():
    a, b = operands(4, 5, 6)
    one = torch.ones(1)
    assert_value_error_naming(lambda: scaled_gemm(a.float(), b, None, None, None, torch.float32),
                              ["a and b", "Float", "BFloat16"])
    assert_value_error_naming(lambda: scaled_gemm(a.to(torch.float8_e4m3fn), b.float(), None, None, None,
                                                  torch.float32), ["a and b", "Float8_e4m3fn", "Float"])
    assert_value_error_naming(lambda: scaled_gemm(a.half(), b, None, None, None, torch.float32),
                              ["a and b", "Half"])
    assert_value_error_naming(lambda: scaled_gemm(a, b[:, :5], None, None, None, torch.float32), ["[4, 6]", "[5, 5]"])
    assert_value_error_naming(lambda: scaled_gemm(a, b, torch.ones(2), None, None, torch.float32),
                              ["a_scale_inv", "[2]"])
    assert_value_error_naming(lambda: scaled_gemm(a, b, None, one.double(), None, torch.float32),
                              ["b_scale_inv", "Double"])
    assert_value_error_naming(lambda: scaled_gemm(a, b, one, None, torch.ones(4), torch.float32), ["bias", "[4]"])
    assert_value_error_naming(lambda: scaled_gemm(a, b, None, None, None, torch.float64), ["out_dtype"])
    assert_value_error_naming(lambda: scaled_gemm(a[0], b, None, None, None, torch.float32), ["2-D"])


# --- high-precision GEMM dtypes ---------------------------------------------------------------

def test_fp16_gemms_are_never_narrowed_to_bf16(cpu_gemm):
    assert linear_gemm.gemm_dtype(torch.device("cpu"), torch.float16) == torch.float32
    assert linear_gemm.gemm_dtype(torch.device("cpu"), torch.bfloat16) == cpu_gemm


@pytest.mark.parametrize("module", ["Linear", "GroupedLinear", "LayerNormLinear"])
def test_fp16_modules_are_as_accurate_as_torch_fp16_linear(cpu_gemm, module):
    """Against float64: an fp16 module's error is at most that of torch's own fp16 linear
    (fp32 sums, one rounding), 2x for slack; with bf16 GEMMs it was 10-18x worse."""
    torch.manual_seed(0)
    x = torch.randn(64, 128, dtype=torch.float16)
    if module == "Linear":
        m = te.Linear(128, 128, params_dtype=torch.float16)
        y = m(x)
        layer_input = x
    elif module == "GroupedLinear":
        m = te.GroupedLinear(1, 128, 128, params_dtype=torch.float16)
        y = m(x, [64])
        layer_input = x
    else:
        m = te.LayerNormLinear(128, 128, params_dtype=torch.float16)
        y, layer_input = m(x), None
        layer_input = torch.nn.functional.layer_norm(x.float(), (128,), m.layer_norm_weight.float(),
                                                     m.layer_norm_bias.float()).half()
    weight, bias = (m.weight0, m.bias0) if module == "GroupedLinear" else (m.weight, m.bias)
    exact = layer_input.double() @ weight.detach().double().t() + bias.detach().double()
    torch_fp16 = torch.nn.functional.linear(layer_input, weight.detach(), bias.detach())
    err_ours = ((y.double() - exact).abs() / exact.abs().clamp_min(1e-2)).max().item()
    err_torch = ((torch_fp16.double() - exact).abs() / exact.abs().clamp_min(1e-2)).max().item()
    assert err_ours <= 2 * err_torch + 1e-4, (err_ours, err_torch)


def test_fp16_layernorm_mlp_is_as_accurate_as_torch_fp16(cpu_gemm):
    torch.manual_seed(0)
    x = torch.randn(64, 128, dtype=torch.float16)
    m = te.LayerNormMLP(128, 256, params_dtype=torch.float16)
    p = {name: t.detach() for name, t in m.named_parameters()}

    def mlp(x, dtype):
        f = torch.nn.functional
        h = f.layer_norm(x.to(dtype), (128,), p["layer_norm_weight"].to(dtype), p["layer_norm_bias"].to(dtype))
        h = f.gelu(f.linear(h, p["fc1_weight"].to(dtype), p["fc1_bias"].to(dtype)), approximate="tanh")
        return f.linear(h, p["fc2_weight"].to(dtype), p["fc2_bias"].to(dtype))
    exact = mlp(x, torch.float64)
    err_ours = (m(x).double() - exact).abs().max().item()
    err_torch = (mlp(x, torch.float16).double() - exact).abs().max().item()
    assert err_ours <= 2 * err_torch, (err_ours, err_torch)


def test_fp16_attention_is_as_accurate_as_torch_fp16(cpu_gemm):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 64, 4, 32, dtype=torch.float16) for _ in range(3))  # [b, s, h, d]
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type="causal")

    def sdpa(dtype):
        out = torch.nn.functional.scaled_dot_product_attention(*(t.to(dtype).transpose(1, 2) for t in (q, k, v)),
                                                               is_causal=True)  # [b, h, s, d]
        return out.transpose(1, 2).reshape(2, 64, 128)
    exact = sdpa(torch.float64)
    err_ours = (dpa(q, k, v).double() - exact).abs().max().item()
    err_torch = (sdpa(torch.float16).double() - exact).abs().max().item()
    assert err_ours <= 2 * err_torch, (err_ours, err_torch)


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("scaled_gemm")


def _block_gemm_operands(d, m, n, k):
    a = ops.fp8_block_quantize(randn(d, m, k, dtype=F32), 1, 32, E4M3, "e8m0", 0.0)
    b = ops.fp8_block_quantize(randn(d, n, k, dtype=F32), 1, 32, E4M3, "e8m0", 0.0)
    return a, b


@CASES.case("fp8_block_gemm")
def _(d):
    (a, a_scales), (b, b_scales) = _block_gemm_operands(d, 6, 64, 96)
    return (a, a_scales, [1, 32], False, b, b_scales, [1, 32], False, None, F32), ()


@CASES.case("scaled_gemm")
def _(d):
    x, _, _, _ = basic_inputs(d)
    scale = torch.tensor([3.0], device=d)
    codes = ops.fp8_quantize(x, scale, E4M3)[0].float()
    return (codes, codes[:4], scale, scale, None, BF16), ()


@CASES.case("scaled_gemm_accumulate")
def _(d):
    x, _, _, _ = basic_inputs(d)
    scale = torch.tensor([3.0], device=d)
    codes = ops.fp8_quantize(x, scale, E4M3)[0]
    return (codes, codes[:4], scale, scale, randn(d, 6, 4, dtype=F32)), ()


@CASES.case("fp8_block_gemm[bf16 out, 48x32x256]", compile=False)
def _(d):
    (a, a_scales), (b, b_scales) = _block_gemm_operands(d, 48, 32, 256)
    return (a, a_scales, [1, 32], False, b, b_scales, [1, 32], False, None, BF16), ()


# scaled_gemm of bf16 and fp32 operands [20, 36] x [24, 36] with both scales and a bias, to
# fp32 and (compiled) to bf16.
for _dtype in (BF16, F32):
    for _out in (F32, BF16):
        @CASES.case(f"scaled_gemm[{dtype_name(_dtype)}, bias, {dtype_name(_out)} out]", compile=_out == BF16)
        def _(d, dtype=_dtype, out=_out):
            return (randn(d, 20, 36, dtype=dtype), randn(d, 24, 36, dtype=dtype), torch.tensor([0.5], device=d),
                    torch.tensor([3.0], device=d), randn(d, 24, dtype=F32), out), ()


# scaled_gemm of FP8 codes as they are (E4M3 x E5M2, and E4M3 x bf16), widened inside the kernel.
for _b_name, _b_dtype in (("e5m2", torch.float8_e5m2), ("bf16", BF16)):
    @CASES.case(f"scaled_gemm[e4m3 codes x {_b_name}, bias, bf16 out]", compile=True)
    def _(d, b_dtype=_b_dtype):
        return (randn(d, 20, 36, dtype=torch.float8_e4m3fn, scale=30.0), randn(d, 24, 36, dtype=b_dtype, scale=30.0),
                torch.tensor([0.5], device=d), torch.tensor([3.0], device=d), randn(d, 24, dtype=F32), BF16), ()


# scaled_gemm_accumulate of bf16 operands into a bf16 out, and of fp32 operands into fp32.
for _dtype in (BF16, F32):
    @CASES.case(f"scaled_gemm_accumulate[{dtype_name(_dtype)}]")
    def _(d, dtype=_dtype):
        return (randn(d, 20, 36, dtype=dtype), randn(d, 24, 36, dtype=dtype), torch.tensor([0.5], device=d), None,
                randn(d, 20, 24, dtype=dtype)), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
