"""NVFP4 casts (reference/nvfp4.py): the ops bit for bit against the reference on every CPU SIMD
tier (codes, scales, amax and dequantized values; stochastic rounding with the same Philox
draws) for every option (1 x 16 / 16 x 16 blocks, transpose, rht, stochastic rounding, 4over6
with each error, row-scaled amaxes, the global scale's bound e4m3_max), input dtype, ragged
and empty shape and stride; edge amaxes and inputs, rounding ties, 4over6's choice, errors;
the op cases (opcheck and torch.compile) at the end."""
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


def check_cast(x, block_rows, transpose, rht, sr_rng, amax=None, per_row=False, e4m3_max=448, four_over_six="off",
               scaled_error=False):
    """Amax (unless given; each row's when per_row), quantize and dequantize of x equal the
    reference's, with the cast's options e4m3_max, four_over_six and scaled_error."""
    want_amax = reference.nvfp4_amax(x, transpose, rht, per_row)
    assert_same_bits(ops.nvfp4_amax(x, transpose, rht, per_row), want_amax, "amax")
    amax = want_amax if amax is None else amax
    options = (e4m3_max, four_over_six, scaled_error)
    data, scales = ops.nvfp4_quantize(x, amax, block_rows, transpose, rht, sr_rng, *options)
    want_data, want_scales = reference.nvfp4_quantize(x, amax, block_rows, transpose, rht, sr_rng, *options)
    assert_same_bits(data, want_data, "codes")
    assert_same_bits(scales, want_scales, "scales")
    rows, cols = data.shape[0], x.shape[0] if transpose else x.shape[1]
    for out_dtype in (torch.float32, x.dtype):
        values = ops.nvfp4_dequantize(data, scales, amax, cols, out_dtype, e4m3_max)
        if rows == 0:  # the reference's unpack_codes cannot reshape zero rows
            assert values.shape == (0, cols) and values.dtype == out_dtype
            continue
        want_values = reference.nvfp4_dequantize(want_data, want_scales, amax, cols, out_dtype, e4m3_max)
        assert_same_bits(values, want_values, "values")


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


@pytest.mark.parametrize("shape, padded", [((33, 70), False), ((257, 300), True), ((16, 4096), False),
                                           ((4100, 48), True), ((48, 4100), False), ((272, 300), True)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transposed_tiles_across_tile_and_panel_boundaries(cpu_tier, dtype, shape, padded):
    """The transposed usage's gather in 16 x 16 tiles: shapes of x whose rows end inside a tile
    or a panel (256 of them per task) or fill them exactly, rows of x read from a wider tensor
    (a leading dimension past the row), each cast with 16 x 16 and 1 x 16 blocks, nearest and
    stochastic, and through the transform where x's rows are whole blocks."""
    x = wide_range(shape[0], shape[1] + (13 if padded else 0), dtype)[:, :shape[1]]
    rht = shape[0] % 16 == 0
    check_cast(x, 16, True, rht, RNG)
    check_cast(x, 1, True, False, None)
    check_cast(x, 16, True, False, None)
    if rht:
        check_cast(x, 1, True, True, None)


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
def test_a_block_of_nans_alone_has_the_amax_0(cpu_tier, dtype, block_rows):
    """NaN is skipped in every block amax, so a block (or tile) of nothing but NaN gets the
    scale 0, also where bf16 block amaxes come from the bits, and where the transform spreads
    one NaN over its whole block (transposed: in the gathered tiles; row-wise: in place)."""
    x = torch.randn(48, 64).to(dtype)
    x[:16, 16:32] = math.nan
    x[20, 40] = math.nan
    for transpose, rht in ((False, False), (False, True), (True, True)):
        check_cast(x, block_rows, transpose, rht, None)
        check_cast(x, block_rows, transpose, rht, RNG)


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


# --- 4over6, row-scaled amaxes and the global scale's bound ------------------------------------

# (four_over_six, scaled_error, e4m3_max): each error rule once, each with either bound.
FOUR_OVER_SIX = [("mae", False, 448), ("mse", False, 256), ("mae", True, 256), ("mse", True, 448)]
SOURCES = {"rowwise": (False, False), "transpose": (True, False), "rht": (False, True), "transpose+rht": (True, True)}


def rule_id(rule):
    four_over_six, scaled_error, e4m3_max = rule
    return f"{four_over_six}{'-scaled' if scaled_error else ''}-{e4m3_max}"


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("rule", FOUR_OVER_SIX, ids=rule_id)
@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_four_over_six_bit_exact_on_every_tier(cpu_tier, dtype, block_rows, rule, source):
    """4over6's two casts, their errors in the reference's fp32 order (its products rounded
    before the sums) and its choice, for a [37, 299] cast ([37, 304] with rht): ragged
    tiles and blocks, NaN, inf and zero blocks, through the transpose and the transform."""
    transpose, rht = SOURCES[source]
    four_over_six, scaled_error, e4m3_max = rule
    rows, cols = 37, 304 if rht else 299
    x = wide_range(*((cols, rows) if transpose else (rows, cols)), dtype)
    check_cast(x, block_rows, transpose, rht, None, e4m3_max=e4m3_max, four_over_six=four_over_six,
               scaled_error=scaled_error)


def rows_of_every_scale(rows, cols, dtype):
    """Rows whose magnitudes span 1e-6 to 1e6, two of them all zeros, one with a NaN, one with
    an inf: each row's own global scale differs."""
    x = torch.randn(rows, cols) * torch.logspace(-6, 6, rows)[:, None]
    x[2], x[rows - 3] = 0.0, 0.0
    x[5, 7], x[9, 3] = math.nan, -math.inf
    return x.to(dtype)


@pytest.mark.parametrize("four_over_six", ["off", "mse"])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_scaled_cast_bit_exact_on_every_tier(cpu_tier, dtype, source, four_over_six):
    """One amax per row of what is cast (nvfp4_amax per_row), each row cast and dequantized with
    its own global scales: all-zero rows (amax 0), a row holding inf, 4over6 row by row."""
    transpose, rht = SOURCES[source]
    x = rows_of_every_scale(37, 304 if rht else 299, dtype)
    check_cast(x.t().contiguous() if transpose else x, 1, transpose, rht, None, per_row=True,
               four_over_six=four_over_six)


@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_global_bound_256_bit_exact_on_every_tier(cpu_tier, dtype, block_rows):
    """e4m3_max 256 without 4over6: S_enc = 1536 / g, the dequantize factor's 1 / 1536; the
    block scales still reach 448 (a caller's amax below the values')."""
    x = wide_range(40, 299, dtype)
    check_cast(x, block_rows, False, False, None, e4m3_max=256)
    check_cast(x, block_rows, False, False, RNG, e4m3_max=256, amax=torch.tensor([1e-3]))


@pytest.mark.parametrize("shape", [(1, 1), (3, 37), (17, 3), (16, 16), (37, 69), (40, 5008)], ids=str)
def test_four_over_six_and_row_scaled_odd_shapes(cpu_tier, shape):
    """Short and ragged rows, ragged 16 x 16 tiles, a single value, several panels of a row;
    values of one scale, whose errors of the two casts are often close (as the scaled error's
    products rounded apart from its difference tell)."""
    x = (torch.randn(shape) * 3).to(torch.bfloat16)
    for block_rows, per_row in ((1, True), (1, False), (16, False)):
        check_cast(x, block_rows, False, False, None, per_row=per_row, four_over_six="mae")
        check_cast(x, block_rows, True, False, None, per_row=per_row, four_over_six="mse", scaled_error=True)


@pytest.mark.parametrize("shape", [(0, 32), (5, 0), (0, 0)], ids=str)
def test_row_scaled_empty_shapes(shape):
    """A row of no values has amax 0; a cast of no rows takes an empty amax."""
    x = torch.randn(shape)
    amax = ops.nvfp4_amax(x, False, False, True)
    assert amax.shape == (shape[0],) and torch.all(amax == 0)
    data, scales = ops.nvfp4_quantize(x, amax, 1, False, False, None, 256, "mse")
    assert data.shape == (shape[0], (shape[1] + 1) // 2) and scales.shape == (shape[0], (shape[1] + 15) // 16)
    assert ops.nvfp4_dequantize(data, scales, amax, shape[1], F32, 256).shape == shape


EDGE_AMAXES = [0.0, math.inf, math.nan, -3.0, 1e-40, 3.4e38, 0.5]


@pytest.mark.parametrize("amax", EDGE_AMAXES, ids=str)
@pytest.mark.parametrize("block_rows", [1, 16], ids=["1x16", "16x16"])
def test_four_over_six_edge_amaxes(cpu_tier, amax, block_rows):
    """Whatever amax a caller hands in: 4over6's errors with S_enc at FLT_MAX (amax 0), inf
    errors (amax inf: a tie keeps map-to-6), NaN scales (amax NaN), saturated values."""
    x = wide_range(40, 96, torch.float32)
    for four_over_six, scaled_error, e4m3_max in FOUR_OVER_SIX:
        check_cast(x, block_rows, False, False, None, amax=torch.tensor([amax]), e4m3_max=e4m3_max,
                   four_over_six=four_over_six, scaled_error=scaled_error)


def test_row_scaled_edge_amaxes(cpu_tier):
    """Each row its own edge amax (0, inf, NaN, negative, subnormal, near FLT_MAX), with and
    without 4over6: a NaN row gets NaN scales and zero codes, its neighbours are unaffected."""
    x = wide_range(21, 96, torch.float32)
    amax = torch.tensor(EDGE_AMAXES * 3)
    for four_over_six in ("off", "mae"):
        check_cast(x, 1, False, False, None, amax=amax, per_row=True, four_over_six=four_over_six)
    check_cast(x, 1, False, False, RNG, amax=amax, per_row=True, e4m3_max=256)


INPUT_KINDS = {"zeros": lambda x: torch.zeros_like(x), "nan": lambda x: x.masked_fill(x > 0.5, math.nan),
               "inf": lambda x: x.masked_fill(x > 1.5, math.inf), "huge": lambda x: x * 3e37,
               "tiny": lambda x: x * 1e-39, "small": lambda x: x * 1e-7}


@pytest.mark.parametrize("kind", INPUT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_four_over_six_edge_inputs(cpu_tier, dtype, kind):
    """All zeros (a tie of two zero errors), NaN (NaN errors keep map-to-6), inf, values at
    the dtype's largest (saturated) and smallest (flushed), in both block shapes and row-scaled."""
    x = INPUT_KINDS[kind](torch.randn(37, 69)).to(dtype)
    for four_over_six, scaled_error, e4m3_max in FOUR_OVER_SIX:
        for block_rows, per_row in ((1, True), (16, False)):
            check_cast(x, block_rows, False, False, None, per_row=per_row, e4m3_max=e4m3_max,
                       four_over_six=four_over_six, scaled_error=scaled_error)


def test_four_over_six_picks_map_to_4_where_it_is_nearer_and_map_to_6_on_a_tie():
    """amax 2688 makes S_enc 1, so a block whose largest value is 6 has base 1: map-to-6's scale
    1, map-to-4's 1.5. Values 1.5 times the E2M1 grid are exact with 1.5 (error 0: map-to-4);
    a block of 6 and zeros is exact with both (a tie: map-to-6)."""
    on_the_grid_of_4 = torch.tensor([6.0, 4.5, 3.0, 2.25, 1.5, 0.75, -6.0, -3.0] + [0.0] * 8)
    tie = torch.tensor([6.0] + [0.0] * 15)
    x = torch.stack([on_the_grid_of_4, tie])
    amax = torch.tensor([2688.0])
    for four_over_six in ("mae", "mse"):
        data, scales = ops.nvfp4_quantize(x, amax, 1, False, False, None, four_over_six=four_over_six)
        assert scales.float()[:, 0].tolist() == [1.5, 1.0]
        assert torch.equal(ops.nvfp4_dequantize(data, scales, amax, 16, F32), x)
        check_cast(x, 1, False, False, None, amax=amax, four_over_six=four_over_six)


# Blocks whose 4over6 choice flips where a kernel fuses the scaled error's x * S_enc into its
# difference (one rounding, an FMA, where the reference rounds twice): with amax 15.5625 both
# keep map-to-6, with the error "mae" and "mse".
FUSED_PRODUCT_FLIPS = {
    "mae": [-1.2265625, -4.25, -0.1669921875, -0.97265625, 2.765625, 3.3125, 6.59375, -1.7734375, 5.1875,
            -0.0791015625, -2.578125, -0.08642578125, -0.47265625, 0.2431640625, -1.828125, -0.06201171875],
    "mse": [1.046875, 1.3203125, -7.75, -2.203125, 2.421875, 1.7734375, -3.75, -2.6875, 0.7265625, -0.98828125,
            3.046875, 3.390625, 1.265625, 1.328125, 0.953125, 3.15625]}


@pytest.mark.parametrize("four_over_six", ["mae", "mse"])
def test_scaled_error_rounds_its_products_before_their_difference(cpu_tier, four_over_six):
    x = torch.tensor([FUSED_PRODUCT_FLIPS[four_over_six]])
    amax = torch.tensor([15.5625])
    map_to_6 = (x.abs().amax() / 6 * (2688 / amax)).to(torch.float8_e4m3fn)
    scales = ops.nvfp4_quantize(x, amax, 1, False, False, None, four_over_six=four_over_six, scaled_error=True)[1]
    assert scales.view(torch.uint8).item() == map_to_6.view(torch.uint8).item()
    check_cast(x, 1, False, False, None, amax=amax, four_over_six=four_over_six, scaled_error=True)


def test_four_over_six_lowers_the_error_of_the_cast():
    """Each block keeps the nearer of its casts: the round trip's mean squared error with 4over6
    "mse" is below the plain cast's."""
    x = torch.randn(256, 512)
    amax = ops.nvfp4_amax(x, False, False)

    def squared_error(four_over_six):
        data, scales = ops.nvfp4_quantize(x, amax, 1, False, False, None, four_over_six=four_over_six)
        return (ops.nvfp4_dequantize(data, scales, amax, 512, F32) - x).square().mean().item()

    assert squared_error("mse") < squared_error("off")


TILE_SHAPES = [(1, 1), (3, 37), (16, 16), (17, 33), (32, 32), (48, 80), (64, 96), (130, 70), (257, 515)]


@pytest.mark.parametrize("shape", TILE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_transpose_tiles_gives_the_transposed_cast(dtype, shape):
    """The column-wise usage of a 16 x 16-tile cast from its row-wise codes equals casting the
    transpose, bit for bit (SIMD steps of 16 rows x 32 columns and the ragged edges alike),
    and the reference's; inputs with NaN, +-inf, -0 and zero blocks."""
    x = wide_range(*shape, dtype) if shape[0] * shape[1] > 123 else randn("cpu", *shape, dtype=dtype)
    amax = ops.nvfp4_amax(x, False, False)
    data, scales = ops.nvfp4_quantize(x, amax, 16, False, False, None)
    want = ops.nvfp4_quantize(x, amax, 16, True, False, None)
    got = ops.nvfp4_transpose_tiles(data, scales, shape[1])
    for got_part, want_part, ref_part, name in zip(got, want, reference.nvfp4_transpose_tiles(data, scales, shape[1]),
                                                   ("codes", "scales")):
        assert_same_bits(got_part, want_part, name)
        assert_same_bits(ref_part, want_part, f"reference {name}")


@pytest.mark.parametrize("amax", [0.0, math.nan, math.inf], ids=["zero", "nan", "inf"])
def test_transpose_tiles_of_edge_amaxes(amax):
    x = torch.randn(40, 48)
    data, scales = ops.nvfp4_quantize(x, torch.tensor([amax]), 16, False, False, None)
    want = ops.nvfp4_quantize(x, torch.tensor([amax]), 16, True, False, None)
    for got_part, want_part, name in zip(ops.nvfp4_transpose_tiles(data, scales, 48), want, ("codes", "scales")):
        assert_same_bits(got_part, want_part, name)


@pytest.mark.parametrize("rows, cols", [(0, 5), (6, 0), (0, 0)])
def test_transpose_tiles_of_empty_shapes(rows, cols):
    data = torch.zeros(rows, (cols + 1) // 2, dtype=torch.uint8)
    scales = torch.zeros(rows, (cols + 15) // 16).to(torch.float8_e4m3fn)
    got_data, got_scales = ops.nvfp4_transpose_tiles(data, scales, cols)
    assert got_data.shape == (cols, (rows + 1) // 2) and got_scales.shape == (cols, (rows + 15) // 16)
    assert got_scales.dtype == torch.float8_e4m3fn


def _gemm_codes(rows, k):
    """(data, scales) of a [rows, k] NVFP4 operand of zeros, on the default device."""
    return (torch.zeros(rows, k // 2, dtype=torch.uint8),
            torch.zeros(rows, k // 16, dtype=torch.float32).to(torch.float8_e4m3fn))


BAD_CALLS = [
    (lambda: ops.nvfp4_amax(torch.randn(2, 4, 16), False, False), ["nvfp4_amax", "input", "2-D", "[2, 4, 16]"]),
    (lambda: ops.nvfp4_amax(torch.randn(4, 16, dtype=torch.float64), False, False), ["input", "Double"]),
    (lambda: ops.nvfp4_amax(torch.randn(4, 24), False, True), ["rht", "24 columns", "multiple of 16", "[4, 24]"]),
    (lambda: ops.nvfp4_amax(torch.randn(24, 32), True, True), ["rht", "input^T", "24 columns"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 8, False, False, None), ["block_rows", "8"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(2), 1, False, False, None),
     ["amax", "one per row", "(4)", "[2]"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(4), 16, False, False, None),
     ["amax", "with block_rows 1", "[4]", "block_rows 16"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(3), 1, True, False, None),
     ["amax", "of what is cast (32)", "[3]"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 1, False, False, None, 300),
     ["nvfp4_quantize", "e4m3_max", "448 or 256", "300"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 1, False, False, None, four_over_six="max"),
     ["four_over_six", "'off', 'mae' or 'mse'", "'max'"]),
    (lambda: ops.nvfp4_quantize(torch.randn(4, 32), torch.ones(1), 1, False, False, torch.ones(2, dtype=torch.int64),
                                four_over_six="mse"), ["four_over_six 'mse'", "sr_rng"]),
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
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                  torch.ones(3), 32, F32), ["amax", "one per row of data (4)", "[3]"]),
    (lambda: ops.nvfp4_dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                  torch.ones(1), 32, F32, 512), ["nvfp4_dequantize", "e4m3_max", "448 or 256", "512"]),
    (lambda: ops.nvfp4_transpose_tiles(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                       30), ["nvfp4_transpose_tiles", "cols 30", "[4, 16]"]),
    (lambda: ops.nvfp4_transpose_tiles(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 3).to(torch.float8_e4m3fn),
                                       32), ["nvfp4_transpose_tiles", "scales", "[4, 3]", "[4, 2]"]),
    (lambda: ops.nvfp4_transpose_tiles(torch.zeros(4, 16, dtype=torch.int8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                       32), ["nvfp4_transpose_tiles", "data", "Char", "Byte"]),
    (lambda: ops.nvfp4_transpose_tiles(torch.zeros(4, 16, dtype=torch.uint8), torch.ones(4, 2), 32),
     ["nvfp4_transpose_tiles", "scales", "Float", "Float8_e4m3fn"]),
    (lambda: ops.nvfp4_transpose_tiles(torch.zeros(64, dtype=torch.uint8), torch.ones(4, 2).to(torch.float8_e4m3fn),
                                       32), ["nvfp4_transpose_tiles", "data", "2-D", "[64]"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 40), *_gemm_codes(3, 40), 40, torch.ones(1), None, None, None, F32),
     ["nvfp4_gemm", "k", "multiple of 16", "40"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 64), *_gemm_codes(3, 64), 32, torch.ones(1), None, None, None, F32),
     ["a_data", "[rows, 16]", "[4, 32]"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 32), _gemm_codes(3, 32)[0], torch.ones(3, 2), 32, torch.ones(1), None,
                            None, None, F32), ["b_scales", "Float", "Float8_e4m3fn"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 32), *_gemm_codes(3, 32), 32, torch.ones(2), None, None, None, F32),
     ["alpha", "[2]", "[1]"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 32), *_gemm_codes(3, 32), 32, torch.ones(1), torch.ones(3), None, None,
                            F32), ["row_scales", "[3]", "[4]", "one per row of a"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 32), *_gemm_codes(3, 32), 32, torch.ones(1), None, None, torch.ones(4),
                            F32), ["bias", "[4]", "[3]"]),
    (lambda: ops.nvfp4_gemm(*_gemm_codes(4, 32), *_gemm_codes(3, 32), 32, torch.ones(1), None, None, None,
                            torch.int32), ["out_dtype", "Int"]),
    (lambda: ops.nvfp4_gemm_accumulate(*_gemm_codes(4, 32), *_gemm_codes(3, 32), 32, torch.ones(1), torch.zeros(3, 4)),
     ["nvfp4_gemm_accumulate", "out", "[3, 4]", "[4, 3]"]),
    (lambda: ops.nvfp4_gemm_accumulate(*_gemm_codes(4, 32), *_gemm_codes(3, 32), 32, torch.ones(1, 1),
                                       torch.zeros(4, 3)), ["nvfp4_gemm_accumulate", "alpha", "[1, 1]"]),
]


@pytest.mark.parametrize("call, words", BAD_CALLS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error(backend, call, words):
    """On every backend (accelerators check in Python, custom_ops/nvfp4.py) and in the fake
    kernels torch.compile traces with (meta tensors)."""
    assert_refused(backend, call, words)


@pytest.mark.parametrize("call", [call for call, _ in BAD_CALLS])
def test_the_kernels_and_the_python_checks_refuse_in_the_same_words(call):
    """bindings/nvfp4_ops.cpp (CPU tensors) and custom_ops/nvfp4.py (meta tensors: the fake
    kernels) raise one message for each bad call."""
    messages = []
    for device in ("cpu", "meta"):
        with torch.device(device), pytest.raises(ValueError) as refused:
            call()
        messages.append(str(refused.value))
    assert messages[0] == messages[1]


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("nvfp4", references={"nvfp4_amax": reference.nvfp4_amax,
                                     "nvfp4_quantize": reference.nvfp4_quantize,
                                     "nvfp4_dequantize": reference.nvfp4_dequantize,
                                     "nvfp4_transpose_tiles": reference.nvfp4_transpose_tiles,
                                     "nvfp4_gemm": reference.nvfp4_gemm,
                                     "nvfp4_gemm_accumulate": reference.nvfp4_gemm_accumulate})


@CASES.case("nvfp4_amax")
def _(d):
    return (randn(d, 6, 96), False, False), ()


@CASES.case("nvfp4_amax[bf16, 48x40, transpose, rht]")
def _(d):
    return (randn(d, 48, 40), True, True), ()


@CASES.case("nvfp4_amax[fp32, 37x69, per_row]")
def _(d):
    return (randn(d, 37, 69, dtype=F32), False, False, True), ()


@CASES.case("nvfp4_quantize")
def _(d):
    x = randn(d, 6, 96)
    return (x, reference.nvfp4_amax(x, False, False), 1, False, False, None), ()


@CASES.case("nvfp4_quantize[fp32, 48x40, 16x16, transpose, rht, stochastic]")
def _(d):
    x = randn(d, 48, 40, dtype=F32)
    return (x, reference.nvfp4_amax(x, True, True), 16, True, True, RNG.to(d)), ()


@CASES.case("nvfp4_quantize[bf16, 37x69, row-scaled, 4over6 mse, e4m3_max 256]")
def _(d):
    x = randn(d, 37, 69)
    return (x, reference.nvfp4_amax(x, False, False, True), 1, False, False, None, 256, "mse"), ()


@CASES.case("nvfp4_quantize[fp32, 48x40, 16x16, transpose, rht, 4over6 mae, scaled error]")
def _(d):
    x = randn(d, 48, 40, dtype=F32)
    return (x, reference.nvfp4_amax(x, True, True), 16, True, True, None, 448, "mae", True), ()


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


@CASES.case("nvfp4_dequantize[row-scaled, e4m3_max 256, 37x69]")
def _(d):
    x = randn(d, 37, 69, dtype=F32)
    amax = reference.nvfp4_amax(x, False, False, True)
    data, scales = reference.nvfp4_quantize(x, amax, 1, False, False, None, 256)
    return (data, scales, amax, 69, BF16, 256), ()


@CASES.case("nvfp4_transpose_tiles")
def _(d):
    x = randn(d, 48, 80)
    data, scales = reference.nvfp4_quantize(x, reference.nvfp4_amax(x, False, False), 16, False, False, None)
    return (data, scales, 80), ()


@CASES.case("nvfp4_transpose_tiles[fp32, 37x69]")
def _(d):
    x = randn(d, 37, 69, dtype=F32)
    data, scales = reference.nvfp4_quantize(x, reference.nvfp4_amax(x, False, False), 16, False, False, None)
    return (data, scales, 69), ()


def _gemm_operand(d, rows, k, **cast):
    """(data, scales) of a [rows, k] operand, codes with their E4M3 scales."""
    x = randn(d, rows, k, dtype=F32)
    return reference.nvfp4_quantize(x, reference.nvfp4_amax(x, False, False), 1, False, False, None, **cast)


@CASES.case("nvfp4_gemm")
def _(d):
    a, b = _gemm_operand(d, 6, 64), _gemm_operand(d, 5, 64)
    return (*a, *b, 64, torch.tensor([0.03], device=d), None, None, None, BF16), ()


@CASES.case("nvfp4_gemm[fp32 out, 37x48x69, row and column scales, bias]")
def _(d):
    a, b = _gemm_operand(d, 37, 48), _gemm_operand(d, 69, 48, e4m3_max=256)
    scales = torch.rand(37, device=d) + 0.5, torch.rand(69, device=d) + 0.5
    return (*a, *b, 48, torch.tensor([1e-3], device=d), *scales, randn(d, 69, dtype=F32), F32), ()


@CASES.case("nvfp4_gemm_accumulate")
def _(d):
    a, b = _gemm_operand(d, 6, 64), _gemm_operand(d, 5, 64)
    return (*a, *b, 64, torch.tensor([0.03], device=d), randn(d, 6, 5)), ()


@CASES.case("nvfp4_gemm_accumulate[fp32 out, 37x48x69]")
def _(d):
    a, b = _gemm_operand(d, 37, 48), _gemm_operand(d, 69, 48)
    return (*a, *b, 48, torch.tensor([1e-3], device=d), randn(d, 37, 69, dtype=F32)), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
