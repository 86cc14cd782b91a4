"""NVFP4 casts (reference/nvfp4.py): the ops bit for bit against the reference on every CPU SIMD
tier (codes, scales, amax and dequantized values; stochastic rounding with the same Philox
draws) for every option (1 x 16 / 16 x 16 blocks, transpose, rht, stochastic rounding), input
dtype, ragged and empty shape and stride; edge amaxes, rounding ties, errors; the op cases
(opcheck and torch.compile) at the end."""
import math

import pytest
import torch

from transformer_engine.pytorch.reference import nvfp4 as reference
from backends import assert_refused
from numerics import sqnr_db
from op_cases import BF16, F32, OpCases, randn

ops = torch.ops.portable_te
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
RNG = torch.tensor([0x5EED_1234_ABCD, (7 << 32) + 3])  # (seed, offset): both halves of each in use


def wide_range(rows, cols, dtype):
    """Magnitudes over several decades along the columns (every block its own scale), with a
    NaN, +-inf, -0, an all-zero block and values that round to zero in different blocks."""
    decades = 3 if dtype == torch.float16 else 8
    x = torch.randn(rows, cols) * torch.logspace(-decades, decades, cols)
    flat = x.view(-1)
    for index, value in ((5, math.nan), (40, math.inf), (77, -math.inf), (90, -0.0), (123, -1e-30)):
        flat[index % flat.numel()] = value
    x[1, :16] = 0.0
    return x.to(dtype)


def assert_same_bits(got, want, name):
    """Equal bit for bit, but any NaN equals any NaN (the reference's NaN payloads and signs
    follow PyTorch's vectorisation)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[got.dtype.itemsize]
    nan = torch.isnan(got.float()) if got.dtype.is_floating_point else torch.zeros_like(got, dtype=torch.bool)
    assert torch.equal(nan, torch.isnan(want.float()) if want.dtype.is_floating_point else nan), f"{name}: NaNs"
    mismatch = (got.view(ints).masked_fill(nan, 0) != want.view(ints).masked_fill(nan, 0)).nonzero()
    assert mismatch.numel() == 0, f"{name}: {mismatch.shape[0]} differ, first at {mismatch[:4].tolist()}"


def check_cast(x, block_rows, transpose, rht, sr_rng, amax=None):
    """Amax (unless given), quantize and dequantize of x equal the reference's."""
    want_amax = reference.nvfp4_amax(x, transpose, rht)
    assert_same_bits(ops.nvfp4_amax(x, transpose, rht), want_amax, "amax")
    amax = want_amax if amax is None else amax
    data, scales = ops.nvfp4_quantize(x, amax, block_rows, transpose, rht, sr_rng)
    want_data, want_scales = reference.nvfp4_quantize(x, amax, block_rows, transpose, rht, sr_rng)
    assert_same_bits(data, want_data, "codes")
    assert_same_bits(scales, want_scales, "scales")
    rows, cols = data.shape[0], x.shape[0] if transpose else x.shape[1]
    for out_dtype in (torch.float32, x.dtype):
        values = ops.nvfp4_dequantize(data, scales, amax, cols, out_dtype)
        if rows == 0:  # the reference's unpack_codes cannot reshape zero rows
            assert values.shape == (0, cols) and values.dtype == out_dtype
            continue
        assert_same_bits(values, reference.nvfp4_dequantize(want_data, want_scales, amax, cols, out_dtype), "values")


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("transpose", [False, True], ids=["rowwise", "transpose"])
@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cast_bit_exact_on_every_tier(cpu_tier, dtype, block_rows, transpose, rht, stochastic):
    """What is cast is [37, 304] with rht (whole blocks of 16 along its rows), else [37, 299]:
    ragged 16-row tiles, a ragged block, an odd column, and a group of the widest vectors
    plus a remainder."""
    rows, cols = 37, 304 if rht else 299
    x = wide_range(*((cols, rows) if transpose else (rows, cols)), dtype)
    check_cast(x, block_rows, transpose, rht, RNG if stochastic else None)


@pytest.mark.parametrize("transpose", [False, True], ids=["rowwise", "transpose"])
@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
def test_wide_inputs_over_several_panels_and_threads(block_rows, transpose):
    """Rows of 5008 values to cast: several tasks along each row, read in place or gathered."""
    x = wide_range(*((5008, 40) if transpose else (40, 5008)), torch.bfloat16)
    check_cast(x, block_rows, transpose, False, None)
    check_cast(x, block_rows, transpose, True, RNG)


VIEWS = {"every other column": lambda t: t[:, ::2], "every other row": lambda t: t[::2],
         "a column slice": lambda t: t[:, 3:200], "transposed": lambda t: t.t(),
         "transposed and sliced": lambda t: t.t()[5:70:3], "expanded": lambda t: t[:1].expand(48, -1)}


@pytest.mark.parametrize("view", VIEWS, ids=list(VIEWS))
@pytest.mark.parametrize("transpose", [False, True], ids=["rowwise", "transpose"])
def test_strided_inputs_need_no_copy(view, transpose):
    x = VIEWS[view](wide_range(96, 256, torch.float16))
    rht = (x.shape[0] if transpose else x.shape[1]) % 16 == 0
    check_cast(x, 16, transpose, rht, RNG)
    check_cast(x, 1, transpose, False, None)


@pytest.mark.parametrize("shape", [(0, 32), (5, 0), (0, 0), (1, 1), (1, 2), (3, 17), (17, 3), (16, 16)], ids=str)
@pytest.mark.parametrize("transpose", [False, True], ids=["rowwise", "transpose"])
def test_empty_and_tiny_shapes(backend, shape, transpose):
    x = (torch.randn(shape) * 3).bfloat16().to(backend.device)
    for block_rows in (1, 16):
        data, scales = ops.nvfp4_quantize(x, ops.nvfp4_amax(x, transpose, False), block_rows, transpose, False, None)
        rows, cols = shape[::-1] if transpose else shape
        assert data.shape == (rows, (cols + 1) // 2) and scales.shape == (rows, (cols + 15) // 16)
        if backend.name == "cpu":
            check_cast(x, block_rows, transpose, False, None)


@pytest.mark.parametrize("amax", [0.0, math.inf, -math.inf, math.nan, -3.0, -0.0, 1e-40, 1e38, 3.4e38, 0.5],
                         ids=str)
@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
def test_edge_amaxes(cpu_tier, amax, block_rows):
    """Whatever amax the caller hands in (reduced over ranks, stale, zero, inf, NaN): S_enc's
    FLT_MAX bound and its 1 for inf, values beyond 6 saturating, a NaN amax's NaN scales and
    zero codes."""
    x = wide_range(40, 96, torch.float32)
    check_cast(x, block_rows, False, False, None, amax=torch.tensor([amax]))
    check_cast(x, block_rows, False, False, RNG, amax=torch.tensor([amax]))


def test_ties_round_to_the_even_code_and_neighbours_round_to_nearest(cpu_tier):
    """With amax 2688 and a 6 in every block, the encode factor is exactly 1: the codes are the
    E2M1 rounding of the values themselves. Ties (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) go to
    the even code, their fp32 neighbours to the nearer value; a negative that rounds to zero
    is -0 (code 8), -0 itself +0."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    values = torch.cat([ties, torch.nextafter(ties, torch.tensor(9.0)), torch.nextafter(ties, torch.tensor(0.0)),
                        torch.tensor([0.0, 6.0])])
    values = torch.cat([values, -values])
    blocks = torch.cat([torch.full((values.numel(), 1), 6.0), values[:, None], torch.zeros(values.numel(), 14)], 1)
    amax = torch.tensor([2688.0])
    data, scales = ops.nvfp4_quantize(blocks, amax, 1, False, False, None)
    assert torch.all(scales.float() == 1.0)
    want = [0, 2, 2, 4, 4, 6, 6] + [1, 2, 3, 4, 5, 6, 7] + [0, 1, 2, 3, 4, 5, 6] + [0, 7]
    assert (data[:, 0] >> 4).tolist() == want + [8 | code for code in want[:-2]] + [0, 15]
    check_cast(blocks, 1, False, False, None, amax=amax)


def test_stochastic_rounding_is_unbiased_and_keyed_by_seed_and_offset():
    x = torch.full((64, 1024), 1.3)
    x[:, ::16] = 6.0  # the encode factor is 1 (see the ties test): 1.3 lies between codes 1.0 and 1.5
    amax = torch.tensor([2688.0])
    data = ops.nvfp4_quantize(x, amax, 1, False, False, RNG)[0]
    assert torch.equal(data, ops.nvfp4_quantize(x, amax, 1, False, False, RNG.clone())[0])
    for other in (RNG + torch.tensor([1, 0]), RNG + torch.tensor([0, 1])):
        assert not torch.equal(data, ops.nvfp4_quantize(x, amax, 1, False, False, other)[0])
    drawn = reference.e2m1_values(reference.unpack_codes(data, 1024))[x == 1.3]
    assert set(drawn.unique().tolist()) == {1.0, 1.5}
    assert abs(drawn.mean().item() - 1.3) < 0.01


def test_round_trip_sqnr():
    x = torch.randn(256, 512) * torch.logspace(-2, 2, 512)
    amax = ops.nvfp4_amax(x, False, False)
    for block_rows, floor in ((1, 18.0), (16, 14.0)):
        data, scales = ops.nvfp4_quantize(x, amax, block_rows, False, False, None)
        assert sqnr_db(x, ops.nvfp4_dequantize(data, scales, amax, 512, F32)) >= floor


def test_rht_spreads_a_spike_over_its_block():
    """The transform of a block holding one 4 is +-1 everywhere (4 / 4 times the signs' and
    H's +-1); amax and codes see the transformed values."""
    x = torch.zeros(2, 32)
    x[0, 3] = 4.0
    assert ops.nvfp4_amax(x, False, True).item() == 1.0 and ops.nvfp4_amax(x, False, False).item() == 4.0
    check_cast(x, 1, False, True, None)


@pytest.mark.parametrize("call, words", [
    (lambda: ops.nvfp4_amax(torch.randn(2, 4, 16), False, False), ["nvfp4_amax", "input", "2-D", "[2, 4, 16]"]),
    (lambda: ops.nvfp4_amax(torch.randn(4, 16, dtype=torch.float64), False, False), ["input", "Double"]),
    (lambda: ops.nvfp4_amax(torch.randn(4, 24), False, True), ["rht", "24 columns", "multiple of 16", "[4, 24]"]),
    (lambda: ops.nvfp4_amax(torch.randn(24, 32), True, True), ["rht", "input^T", "24 columns"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 8, False, False, None), ["block_rows", "8"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(2), 1, False, False, None), ["amax", "[2]"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1, dtype=torch.float64), 1, False, False, None),
     ["amax", "Double", "Float"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 1, False, False, torch.ones(3, dtype=torch.int64)),
     ["sr_rng", "[3]", "[2]"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 1, False, False, torch.ones(2)),
     ["sr_rng", "Float", "Long"]),
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                  torch.ones(1), 30, F32), ["cols 30", "[4, 16]"]),
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 3).to(torch.float8_e4m3fn),
                                  torch.ones(1), 32, F32), ["scales", "[4, 3]", "[4, 2]"]),
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2), torch.ones(1), 32, F32),
     ["scales", "Float", "Float8_e4m3fn"]),
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.int8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                  torch.ones(1), 32, F32), ["data", "Char", "Byte"]),
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                  torch.ones(1), 32, torch.int32), ["out_dtype", "Int"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error(backend, call, words):
    """On every backend (accelerators check in Python, custom_ops/nvfp4.py) and in the fake
    kernels torch.compile traces with (meta tensors)."""
    assert_refused(backend, call, words)


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("nvfp4", references={"nvfp4_amax": reference.nvfp4_amax,
                                     "nvfp4_quantize": reference.nvfp4_quantize,
                                     "nvfp4_dequantize": reference.nvfp4_dequantize})


@CASES.case("nvfp4_amax")
def _(d):
    return (randn(d, 6, 96), False, False), ()


@CASES.case("nvfp4_amax[bf16, 48x40, transpose, rht]")
def _(d):
    return (randn(d, 48, 40), True, True), ()


@CASES.case("nvfp4_quantize")
def _(d):
    x = randn(d, 6, 96)
    return (x, reference.nvfp4_amax(x, False, False), 1, False, False, None), ()


@CASES.case("nvfp4_quantize[fp32, 48x40, 16x16, transpose, rht, stochastic]")
def _(d):
    x = randn(d, 48, 40, dtype=F32)
    return (x, reference.nvfp4_amax(x, True, True), 16, True, True, RNG.to(d)), ()


@CASES.case("nvfp4_dequantize")
def _(d):
    x = randn(d, 6, 96)
    amax = reference.nvfp4_amax(x, False, False)
    data, scales = reference.nvfp4_quantize(x, amax, 1, False, False, None)
    return (data, scales, amax, 96, BF16), ()


@CASES.case("nvfp4_dequantize[fp16 out, 5x37]")
def _(d):
    x = randn(d, 5, 37, dtype=F32)
    amax = reference.nvfp4_amax(x, False, False)
    data, scales = reference.nvfp4_quantize(x, amax, 1, False, False, None)
    return (data, scales, amax, 37, torch.float16), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
