"""FP8 cast ops: bit-exact against the reference (PyTorch's own rounding after an explicit
clamp) on every CPU SIMD tier, saturation, NaN, amax, odd shapes, SQNR,
errors (opcheck and torch.compile of the ops: the op cases at the end)."""
import math

import pytest
import torch

from transformer_engine.pytorch import reference, scaling
from backends import assert_refused
from numerics import assert_same_fp8, assert_value_error_naming, sqnr_db
from op_cases import BF16, E4M3, E5M2, F32, OpCases, basic_inputs, randn

ops = torch.ops.portable_te
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
HIGH = [torch.float32, torch.bfloat16, torch.float16]


def sweep(dtype):
    """Values across the whole range: every float16 bit pattern (covers FP8 subnormals, ties,
    overflow, inf, NaN), widened, plus random fp32."""
    halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    return torch.cat([halves, torch.randn(4099) * 300]).to(dtype)


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", HIGH, ids=str)
@pytest.mark.parametrize("scale", [1.0, 0.37, 64.0])
def test_quantize_bit_exact_on_every_tier(cpu_tier, fp8_dtype, dtype, scale):
    check_quantize_sweep(fp8_dtype, dtype, scale, "cpu")


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", HIGH, ids=str)
@pytest.mark.parametrize("scale", [1.0, 0.37, 64.0])
def test_quantize_bit_exact_on_every_backend(backend, fp8_dtype, dtype, scale):
    check_quantize_sweep(fp8_dtype, dtype, scale, backend.device)


def interpreter_skips_large(backend, numel):
    """Triton's interpreter runs a kernel's programs one after another: the largest shapes
    (thousands of programs) are left to the compiled backends."""
    if backend.name == "triton-interpreter" and numel > (1 << 22):
        pytest.skip("thousands of programs: too slow in Triton's interpreter")


def check_quantize_sweep(fp8_dtype, dtype, scale, device):
    x = sweep(dtype).to(device)
    s = torch.tensor([scale], device=device)
    data, amax = ops.fp8_quantize(x, s, fp8_dtype)
    want, want_amax = reference.fp8_quantize(x, s, fp8_dtype)
    assert_same_fp8(data, want)
    assert amax.item() == want_amax.item() == math.inf  # the sweep's NaNs are skipped, its infs count


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
def test_saturates_instead_of_overflowing(backend, fp8_dtype):
    fp8_max = torch.finfo(fp8_dtype).max
    x = torch.tensor([1e30, -1e30, math.inf, -math.inf, fp8_max * 1.01, -fp8_max * 4], device=backend.device)
    data, amax = ops.fp8_quantize(x, torch.ones(1, device=backend.device), fp8_dtype)
    assert torch.equal(data.float().cpu(), torch.tensor([fp8_max, -fp8_max] * 3))
    assert amax.item() == math.inf


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("shape", [(1,), (3, 37, 69), (0, 16), (1000003,), (4096, 4097)], ids=str)
def test_amax_and_round_trip(backend, fp8_dtype, shape):
    interpreter_skips_large(backend, math.prod(shape))
    x = torch.randn(shape, dtype=torch.bfloat16, device=backend.device) * 5
    amax_want = x.float().abs().amax().item() if x.numel() else 0.0
    scale = torch.tensor([torch.finfo(fp8_dtype).max / max(amax_want, 1e-12)], device=backend.device)
    data, amax = ops.fp8_quantize(x, scale, fp8_dtype)
    assert amax.item() == amax_want and amax.dtype == torch.float32 and amax.shape == ()
    back = ops.fp8_dequantize(data, 1 / scale, torch.bfloat16)
    assert back.shape == x.shape and back.dtype == torch.bfloat16
    assert torch.equal(back, reference.fp8_dequantize(data, 1 / scale, torch.bfloat16))
    if x.numel() > 100:
        floor = 25 if fp8_dtype == torch.float8_e4m3fn else 18  # E5M2 has one mantissa bit less
        assert sqnr_db(x.float(), back.float()) >= floor


def test_cast_round_trip_sqnr_floor_e4m3():
    x = torch.randn(4096, 257)
    scale = torch.tensor([448.0]) / x.abs().amax()
    data, _ = ops.fp8_quantize(x, scale, torch.float8_e4m3fn)
    assert sqnr_db(x, ops.fp8_dequantize(data, 1 / scale, torch.float32)) >= 25


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("out_dtype", HIGH, ids=str)
def test_dequantize_every_code_on_every_tier(cpu_tier, fp8_dtype, out_dtype):
    check_dequantize_every_code(fp8_dtype, out_dtype, "cpu")


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("out_dtype", HIGH, ids=str)
def test_dequantize_every_code_on_every_backend(backend, fp8_dtype, out_dtype):
    check_dequantize_every_code(fp8_dtype, out_dtype, backend.device)


def check_dequantize_every_code(fp8_dtype, out_dtype, device):
    codes = torch.arange(256, dtype=torch.uint8, device=device).repeat(3)[:701].view(fp8_dtype)
    scale_inv = torch.tensor([0.3], device=device)
    got = ops.fp8_dequantize(codes, scale_inv, out_dtype)
    want = reference.fp8_dequantize(codes, scale_inv, out_dtype)
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    assert torch.equal(got[~nan], want[~nan])


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
def test_dequantize_subnormal_codes_survive_flush_denormal_mode(cpu_tier, fp8_dtype):
    # FP8 subnormals are far above fp32's: a flush-to-zero / denormals-are-zero mode must not
    # zero them, whatever fp32 intermediates a tier's conversion forms.
    codes = torch.arange(256, dtype=torch.uint8).view(fp8_dtype)
    scale_inv = torch.tensor([1.0])
    want = reference.fp8_dequantize(codes, scale_inv, torch.float32)
    assert torch.set_flush_denormal(True), "this CPU has no flush-denormal mode"
    try:
        got = ops.fp8_dequantize(codes, scale_inv, torch.float32)
    finally:
        torch.set_flush_denormal(False)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan], want[~nan])
    assert (got[1:8] > 0).all()  # the smallest positive codes are subnormal


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (130, 65), (2, 65, 129), (0, 8), (4097, 1000), (4099, 4100)],
                         ids=str)  # the last: outputs above 16 MiB, streaming stores
def test_quantize_transpose_on_every_tier(cpu_tier, fp8_dtype, shape):
    check_quantize_transpose(fp8_dtype, shape, "cpu")


@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (130, 65), (2, 65, 129), (0, 8), (4, 0), (4097, 1000)], ids=str)
def test_quantize_transpose_on_every_backend(backend, fp8_dtype, shape):
    interpreter_skips_large(backend, math.prod(shape) * 16)  # 64 x 64 tiles: 16x the programs of a flat cast
    check_quantize_transpose(fp8_dtype, shape, backend.device)


def check_quantize_transpose(fp8_dtype, shape, device):
    x = torch.randn(shape, dtype=torch.bfloat16, device=device) * 50
    scale = torch.tensor([1.5], device=device)
    data, data_t, amax = ops.fp8_quantize_transpose(x, scale, fp8_dtype)
    want, want_t, want_amax = reference.fp8_quantize_transpose(x, scale, fp8_dtype)
    assert data_t.shape == (shape[-1], x.numel() // shape[-1] if shape[-1] else 0)
    assert_same_fp8(data, want)
    assert_same_fp8(data_t, want_t)
    assert amax.item() == want_amax.item()


def test_non_contiguous_input(backend):
    x = torch.randn(64, 48, device=backend.device).t()
    scale = torch.tensor([3.0], device=backend.device)
    data, amax = ops.fp8_quantize(x, scale, torch.float8_e4m3fn)
    want, want_amax = reference.fp8_quantize(x.contiguous(), scale, torch.float8_e4m3fn)
    assert_same_fp8(data, want)
    assert amax.item() == want_amax.item()


@pytest.mark.parametrize("call, words", [
    (lambda: ops.fp8_quantize(torch.randn(4), torch.ones(1), torch.bfloat16), ["fp8_dtype", "BFloat16"]),
    (lambda: ops.fp8_quantize(torch.randn(4).double(), torch.ones(1), torch.float8_e4m3fn), ["input", "Double"]),
    (lambda: ops.fp8_quantize(torch.randn(4), torch.ones(2), torch.float8_e4m3fn), ["scale", "[2]"]),
    (lambda: ops.fp8_quantize(torch.randn(4), torch.ones(1).double(), torch.float8_e4m3fn), ["scale", "Double"]),
    (lambda: ops.fp8_dequantize(torch.randn(4), torch.ones(1), torch.float32), ["data", "Float"]),
    (lambda: ops.fp8_dequantize(torch.zeros(4, dtype=torch.float8_e4m3fn), torch.ones(1), torch.int32),
     ["out_dtype", "Int"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python, custom_ops/_fp8_checks.py)
    and in the fake kernels torch.compile traces with (meta tensors)."""
    assert_refused(backend, call, words)


# Partial 16 x 16 blocks (the CPU's) and 64 x 64 tiles (Triton's), single rows and columns, empty
# sides, and a matrix of many tiles.
TRANSPOSE_SHAPES = [(1, 1), (16, 16), (3, 37), (17, 33), (1, 300), (300, 1), (131, 300), (300, 5), (0, 7), (4, 0),
                    (256, 4096)]


def check_fp8_transpose(shape, fp8_dtype, device):
    """Codes moved only: bit for bit the reference's transpose, contiguous, of a contiguous
    matrix and of views read through their strides (a column slice, a transposed matrix, every
    other row)."""
    from transformer_engine.pytorch.custom_ops.fp8_cast import fp8_transpose
    rows, cols = shape
    views = [torch.randint(0, 256, shape, dtype=torch.uint8, device=device),
             torch.randint(0, 256, (rows, cols + 3), dtype=torch.uint8, device=device)[:, 1:1 + cols],
             torch.randint(0, 256, (cols, rows), dtype=torch.uint8, device=device).t(),
             torch.randint(0, 256, (2 * rows, cols), dtype=torch.uint8, device=device)[::2]]
    for codes in views:
        data = codes.view(fp8_dtype)
        got = fp8_transpose(data)
        assert got.dtype == fp8_dtype and got.shape == shape[::-1] and got.is_contiguous(), codes.stride()
        assert torch.equal(got.view(torch.uint8), reference.fp8_transpose(data).view(torch.uint8)), codes.stride()


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
def test_fp8_transpose_is_the_transposed_copy_on_every_tier(cpu_tier, shape, fp8_dtype):
    check_fp8_transpose(shape, fp8_dtype, "cpu")


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
def test_fp8_transpose_is_the_transposed_copy_on_every_backend(backend, shape, fp8_dtype):
    check_fp8_transpose(shape, fp8_dtype, backend.device)


def test_fp8_transpose_past_2_gib(backend):
    """More than 2^31 codes, with rows of odd lengths: 64-bit offsets on either side. On a GPU
    only: on CPU it would move 4 GiB (and run half a million programs in the interpreter)."""
    if backend.device.type == "cpu":
        pytest.skip("4 GiB of codes moved: left to the GPUs")
    from transformer_engine.pytorch.custom_ops.fp8_cast import fp8_transpose
    codes = torch.randint(0, 256, (65539, 32771), dtype=torch.uint8, device=backend.device)
    got = fp8_transpose(codes.view(torch.float8_e5m2))
    assert torch.equal(got.view(torch.uint8), codes.t())


def test_fp8_transpose_refuses_what_is_not_a_matrix_of_codes():
    from transformer_engine.pytorch.custom_ops.fp8_cast import fp8_transpose
    codes = torch.zeros(4, 5, dtype=torch.float8_e4m3fn)
    assert_value_error_naming(lambda: fp8_transpose(codes.float()), ["fp8_transpose", "data"])
    assert_value_error_naming(lambda: fp8_transpose(codes.reshape(20)), ["fp8_transpose", "2-D"])


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CURRENT_INPUTS = {
    "normal": lambda: torch.randn(5, 37) * 3,
    "tiny (the quotient overflows)": lambda: torch.full((3, 4), 1e-39),
    "zeros": lambda: torch.zeros(4, 8),
    "negative zero": lambda: torch.tensor([-0.0, -0.0]),
    "a NaN": lambda: torch.tensor([math.nan, 1.0, -3.0]),
    "inf": lambda: torch.tensor([math.inf, 1.0]),
    "NaNs only": lambda: torch.full((7,), math.nan),
    "no elements": lambda: torch.empty(0, 16),
    "one decoding row": lambda: torch.randn(1, 4096),
}


@pytest.mark.parametrize("values", list(CURRENT_INPUTS), ids=str)
@pytest.mark.parametrize("dtype", HIGH, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("amax_epsilon, power_2", [(0.0, False), (0.0, True), (1e-3, False), (4.0, True)])
def test_current_scaling_cast_matches_its_parts(backend, values, dtype, fp8_dtype, amax_epsilon, power_2):
    """fp8_quantize_current: the amax (NaN skipped, inf counted, 0 over nothing), the scale of
    scaling.current_scale (1 for an amax of 0, inf or NaN; FLT_MAX where it overflows; the
    epsilon; powers of two), its inverse and the codes of fp8_quantize at that scale, bit for bit."""
    x = CURRENT_INPUTS[values]().to(dtype).to(backend.device)
    data, scale, scale_inv, amax = ops.fp8_quantize_current(x, fp8_dtype, amax_epsilon, power_2)
    want_amax = scaling.amax(x).reshape(1)
    want_scale = scaling.current_scale(want_amax, torch.finfo(fp8_dtype).max, amax_epsilon, power_2)
    for got, want in ((amax, want_amax), (scale, want_scale), (scale_inv, torch.reciprocal(want_scale))):
        assert got.dtype == torch.float32 and got.shape == (1,)
        assert torch.equal(got.cpu(), want.cpu()), (got, want)
    assert_same_fp8(data, reference.fp8_quantize(x, want_scale, fp8_dtype)[0])


def _slot_state(device, live=(0.5, 0.0, math.nan)):
    """scales, amax_history and amax_recorded of a three-slot state (fp8/state.py's ScalingGroup)."""
    history = torch.zeros(4, 3)
    history[0], history[1] = torch.tensor(live), 9.0
    return (torch.tensor([2.0, 0.125, 448.0]).to(device), history.to(device),
            torch.tensor([False, False, True]).to(device))


@pytest.mark.parametrize("values", ["normal", "zeros", "a NaN", "inf", "no elements", "one decoding row"])
@pytest.mark.parametrize("dtype", HIGH, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8, ids=str)
@pytest.mark.parametrize("slot", [0, 1, 2])
def test_delayed_scaling_cast_is_the_cast_and_its_record(backend, values, dtype, fp8_dtype, slot):
    """fp8_quantize_delayed_: the codes and 1 / scale of fp8_quantize at scales[slot], the amax
    max-accumulated into the live row's slot (a NaN already there stays, other slots and rows
    untouched) and the slot marked, against those steps in plain PyTorch."""
    x = CURRENT_INPUTS[values]().to(dtype).to(backend.device)
    scales, history, recorded = _slot_state(backend.device)
    want_history, want_recorded = history.clone(), recorded.clone()
    data, scale_inv = ops.fp8_quantize_delayed_(x, scales, slot, history, recorded, fp8_dtype)
    want_data, amax = reference.fp8_quantize(x, scales[slot:slot + 1], fp8_dtype)
    want_history[0, slot] = torch.maximum(want_history[0, slot], amax)
    want_recorded[slot] = True
    assert_same_fp8(data, want_data)
    assert torch.equal(scale_inv.cpu(), torch.reciprocal(scales[slot:slot + 1]).cpu())
    assert torch.allclose(history.cpu(), want_history.cpu(), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(recorded.cpu(), want_recorded.cpu())


def test_delayed_scaling_cast_refuses_bad_arguments():
    x = torch.randn(4, 8)
    scales, history, recorded = _slot_state("cpu")
    cast = lambda *args: lambda: ops.fp8_quantize_delayed_(*args)  # noqa: E731
    assert_value_error_naming(cast(x, scales, 3, history, recorded, torch.float8_e4m3fn), ["slot 3", "3 slots"])
    assert_value_error_naming(cast(x, scales, 0, history[:, :2], recorded, torch.float8_e4m3fn), ["amax_history"])
    assert_value_error_naming(cast(x, scales, 0, history, recorded.float(), torch.float8_e4m3fn), ["amax_recorded"])
    assert_value_error_naming(cast(x, scales.double(), 0, history, recorded, torch.float8_e4m3fn), ["scales"])


def test_current_scaling_cast_refuses_bad_arguments():
    x = torch.randn(4, 8)
    assert_value_error_naming(lambda: ops.fp8_quantize_current(x, torch.float8_e4m3fn, -1.0, False), ["amax_epsilon"])
    assert_value_error_naming(lambda: ops.fp8_quantize_current(x, torch.bfloat16, 0.0, False), ["fp8_dtype"])
    assert_value_error_naming(lambda: ops.fp8_quantize_current(x.double(), torch.float8_e4m3fn, 0.0, False), ["input"])


CASES = OpCases("fp8_cast")


@CASES.case("fp8_quantize")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (x, torch.tensor([3.0], device=d), E4M3), (0,)


@CASES.case("fp8_quantize_transpose")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (x, torch.tensor([3.0], device=d), E5M2), (0, 1)


@CASES.case("fp8_quantize_current")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (x, E4M3, 0.0, False), (0,)


# Power-of-two scales and an epsilon above the amax (the scale then comes from the epsilon).
@CASES.case("fp8_quantize_current[e5m2, pow2, epsilon, 6x33]", compile=False)
def _(d):
    return (randn(d, 6, 33, dtype=F32, scale=1e-3), E5M2, 0.5, True), (0,)


@CASES.case("fp8_quantize_delayed_", compile=False)
def _(d):
    x, _, _, _ = basic_inputs(d)
    scales, history, recorded = _slot_state(d, live=(0.5, 0.0, 7.0))
    return (x, scales, 1, history, recorded, E4M3), (0,)


@CASES.case("fp8_dequantize")
def _(d):
    x, _, _, _ = basic_inputs(d)
    scale = torch.tensor([3.0], device=d)
    codes, _ = ops.fp8_quantize(x, scale, E4M3)
    return (codes, 1 / scale, BF16), ()


@CASES.case("fp8_transpose")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (ops.fp8_quantize(x, torch.tensor([3.0], device=d), E4M3)[0],), (0,)


# Odd sizes: partial 16 x 16 blocks and a partial tile; E5M2 codes.
@CASES.case("fp8_transpose[e5m2, 131 x 300]")
def _(d):
    x = randn(d, 131, 300)
    return (ops.fp8_quantize(x, torch.tensor([3.0], device=d), E5M2)[0],), (0,)


# FP8 casts: an odd width (33), both formats.
@CASES.case("fp8_quantize[bf16, 6x33]", compile=False)
def _(d):
    return (randn(d, 6, 33), torch.tensor([7.0], device=d), E4M3), (0,)


@CASES.case("fp8_quantize_transpose[bf16, 6x33, e5m2]", compile=False)
def _(d):
    return (randn(d, 6, 33), torch.tensor([7.0], device=d), E5M2), (0, 1)


@CASES.case("fp8_dequantize[e5m2 to fp32]", compile=False)
def _(d):
    scale = torch.tensor([7.0], device=d)
    codes, _ = ops.fp8_quantize(randn(d, 6, 33), scale, E5M2)
    return (codes, 1 / scale, F32), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
