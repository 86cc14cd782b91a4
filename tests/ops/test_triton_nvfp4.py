"""The Triton NVFP4 kernels (transformer_engine/pytorch/triton/nvfp4.py, nvfp4_gemm.py), called
directly (on the GPU, else in Triton's interpreter on CPU tensors): the casts bit-exact against the specification
(reference/nvfp4.py) for every option (fp32 / bf16 / fp16 inputs, ragged shapes, transpose,
the random Hadamard transform, 16 x 16 blocks, stochastic rounding with the reference's Philox
draws, per-row amaxes, 4over6 with its error sums, E = 448 or 256, zeros / NaN / inf /
subnormal inputs); the GEMM within fp32 summation's bound of the exact float64 product of the
decoded operands; what falls back to the reference; and the sm_90 / sm_100 builds."""
import json
import os
import subprocess
import sys

import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from transformer_engine.pytorch.reference import nvfp4 as spec
from triton_harness import POINTER, compile_report

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from transformer_engine.pytorch.triton import _device, nvfp4, nvfp4_gemm  # noqa: E402

# The interpreter computes in numpy, which warns of what the kernels mean: 1 / 0 = inf where a
# block's scale is 0 (its encode is then FLT_MAX), inf - inf = NaN and overflows of inf inputs.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

_CAST_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit patterns (E4M3 scales and float outputs alike: -0 and NaN included)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    as_bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[got.element_size()]
    got_bits, want_bits = got.view(as_bits), want.view(as_bits)
    mismatches = (got_bits != want_bits).nonzero()
    assert not len(mismatches), f"{len(mismatches)} differ, first at {mismatches[0].tolist()}: " \
                                f"{got[tuple(mismatches[0])]} vs {want[tuple(mismatches[0])]}"


def _check_cast(x: torch.Tensor, block_rows: int = 1, transpose: bool = False, rht: bool = False, sr_rng=None,
                per_row: bool = False, e4m3_max: int = 448, four_over_six: str = "off", scaled_error: bool = False,
                amax=None, on_device=None):
    """amax, codes, scales and dequantized values of the kernels (on DEVICE: on_device, or a copy
    of x) equal the reference's bits (on the CPU); returns the reference's (amax, scales)."""
    on_device = x.to(DEVICE) if on_device is None else on_device
    want_amax = spec.nvfp4_amax(x, transpose, rht, per_row)
    _assert_same_bits(nvfp4.nvfp4_amax(on_device, transpose, rht, per_row).cpu(), want_amax)
    amax = want_amax if amax is None else amax
    options = (block_rows, transpose, rht, sr_rng, e4m3_max, four_over_six, scaled_error)
    want_data, want_scales = spec.nvfp4_quantize(x, amax, *options)
    device_options = (block_rows, transpose, rht, None if sr_rng is None else sr_rng.to(DEVICE), *options[4:])
    got_data, got_scales = nvfp4.nvfp4_quantize(on_device, amax.to(DEVICE), *device_options)
    _assert_same_bits(got_data.cpu(), want_data)
    _assert_same_bits(got_scales.cpu(), want_scales)
    cols = x.shape[0] if transpose else x.shape[1]
    for out_dtype in (x.dtype, torch.float32):
        got = nvfp4.nvfp4_dequantize(want_data.to(DEVICE), want_scales.to(DEVICE), amax.to(DEVICE), cols, out_dtype,
                                     e4m3_max)
        _assert_same_bits(got.cpu(), spec.nvfp4_dequantize(want_data, want_scales, amax, cols, out_dtype, e4m3_max))
    return amax, want_scales


def _spread(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Normal values with rows of magnitudes 2^-6 .. 2^6, so blocks take many scales."""
    magnitudes = 2.0 ** torch.randint(-6, 7, (rows, 1)).float()
    return (torch.randn(rows, cols) * magnitudes).to(dtype)


@pytest.mark.parametrize("dtype", list(_CAST_DTYPES), ids=str)
@pytest.mark.parametrize("shape, block_rows, transpose, rht", [
    ((3, 37), 1, False, False), ((37, 69), 1, True, False), ((48, 272), 1, False, True),
    ((48, 272), 16, False, False), ((37, 69), 16, True, False), ((80, 48), 16, True, True)],
    ids=["3x37", "37x69-transpose", "48x272-rht", "48x272-16x16", "37x69-16x16-transpose", "80x48-16x16-transpose-rht"])
def test_casts_match_the_reference(dtype, shape, block_rows, transpose, rht):
    _check_cast(_spread(*shape, _CAST_DTYPES[dtype]), block_rows, transpose, rht)


def test_casts_read_strided_views():
    """Every other row and a slice of columns; the transposed cast of a column slice."""
    base = _spread(64, 160, torch.bfloat16)
    on_device = base.to(DEVICE)
    _check_cast(base[::2, 16:101], on_device=on_device[::2, 16:101])
    _check_cast(base[3:51, 32:144], transpose=True, rht=True, on_device=on_device[3:51, 32:144])


@pytest.mark.parametrize("seed, offset", [(1234, 0), (-5, (7 << 32) + 99)], ids=["seed", "negative-seed-high-offset"])
@pytest.mark.parametrize("dtype, shape, block_rows, transpose, rht", [
    ("fp32", (37, 69), 1, False, False), ("bf16", (48, 272), 1, True, True), ("fp16", (40, 48), 16, False, False)],
    ids=["fp32-37x69", "bf16-48x272-transpose-rht", "fp16-40x48-16x16"])
def test_stochastic_rounding_draws_the_references_words(seed, offset, dtype, shape, block_rows, transpose, rht):
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    _check_cast(_spread(*shape, _CAST_DTYPES[dtype]), block_rows, transpose, rht, sr_rng=rng)


@pytest.mark.parametrize("dtype, shape, transpose, rht, four_over_six", [
    ("bf16", (37, 69), False, False, "off"), ("fp32", (48, 40), True, True, "off"),
    ("fp16", (37, 64), False, False, "mse")])
def test_row_scaled_casts_take_each_rows_amax(dtype, shape, transpose, rht, four_over_six):
    amax, _ = _check_cast(_spread(*shape, _CAST_DTYPES[dtype]), transpose=transpose, rht=rht, per_row=True,
                          four_over_six=four_over_six)
    assert amax.shape == (shape[1] if transpose else shape[0],) and len(amax.unique()) > 1


def _chosen_counts(x, amax, block_rows, e4m3_max, scales):
    """(blocks whose scale is map-to-4's, map-to-6's) where the two differ: both casts are picked."""
    encode = spec.global_scales(amax.reshape(-1, 1), e4m3_max)[0]
    rows, cols = x.shape
    padded = torch.nn.functional.pad(x.float(), (0, -cols % 16, 0, -rows % block_rows))
    blocks = padded.reshape(padded.shape[0] // block_rows, block_rows, -1, 16)
    base = (blocks.abs().amax(dim=(1, 3)) / 6.0) * encode
    scale4, scale6 = ((base * factor).clamp(-448, 448).to(torch.float8_e4m3fn).float() for factor in (1.5, 1.0))
    chosen = scales.float()[::block_rows]
    differ = scale4 != scale6
    return int((differ & (chosen == scale4)).sum()), int((differ & (chosen == scale6)).sum())


@pytest.mark.parametrize("four_over_six, scaled_error, block_rows, e4m3_max, dtype", [
    ("mae", False, 1, 256, "bf16"), ("mse", False, 1, 256, "fp32"), ("mae", True, 1, 448, "fp16"),
    ("mse", True, 16, 256, "bf16"), ("mae", False, 16, 448, "fp32")])
def test_four_over_six_keeps_the_references_cast_per_block(four_over_six, scaled_error, block_rows, e4m3_max, dtype):
    """Both casts of a block, their errors summed in the reference's fp32 order (the 16 values
    one after another; a 16 x 16 tile's rows as a tree), the same one kept; the data picks
    map-to-4 for some blocks and map-to-6 for others."""
    x = _spread(48, 96, torch.float32)
    # Every other column of blocks holds multiples 0..4 of a step (one per 16 rows): map-to-4's grid.
    steps = (2.0 ** torch.randint(-6, 7, (3, 1)).float()).repeat_interleave(16, dim=0)
    x.view(48, 3, 2, 16)[:, :, 0] = (torch.randint(-4, 5, (48, 96 // 2)).float() * steps).view(48, 3, 16)
    x = x.to(_CAST_DTYPES[dtype])
    amax, scales = _check_cast(x, block_rows, e4m3_max=e4m3_max, four_over_six=four_over_six,
                               scaled_error=scaled_error)
    to_4, to_6 = _chosen_counts(x, amax, block_rows, e4m3_max, scales)
    assert to_4 > 0 and to_6 > 0, (to_4, to_6)


def _order_sensitive_blocks(squared: bool, scaled_error: bool, pool: int):
    """(blocks [count, 16] bf16, the pool's amax): blocks of a random pool whose 4over6 choice
    changes if their 16 errors are summed pairwise or backwards instead of the reference's
    sequential order, each a row of its own."""
    x = (torch.randn(pool, 16) * 2.0 ** torch.randint(-3, 4, (pool, 1)).float()).to(torch.bfloat16).float()
    amax = spec.nvfp4_amax(x, False, False)
    encode, decode = spec.global_scales(amax)
    base = (x.abs().amax(dim=1, keepdim=True) / 6.0) * encode
    in_orders = []  # per cast: the errors summed sequentially, pairwise, backwards
    for scale in ((base * factor).clamp(-448, 448).to(torch.float8_e4m3fn).float() for factor in (1.5, 1.0)):
        block_encode = torch.minimum(torch.reciprocal(scale * decode), torch.tensor(spec.FLT_MAX))
        values = spec.e2m1_values(spec.e2m1_codes((x * block_encode).clamp(-6.0, 6.0))) * scale
        d = values - x * encode if scaled_error else values * amax / torch.tensor(2688.0) - x
        errors = d * d if squared else d.abs()
        sequential, backwards, pairwise = torch.zeros(pool), torch.zeros(pool), errors
        for i in range(16):
            sequential, backwards = sequential + errors[:, i], backwards + errors[:, 15 - i]
        while pairwise.shape[1] > 1:
            pairwise = pairwise[:, 0::2] + pairwise[:, 1::2]
        in_orders.append((sequential, pairwise[:, 0], backwards))
    choices = [four < six for four, six in zip(*in_orders)]
    sensitive = (choices[0] != choices[1]) | (choices[0] != choices[2])
    return x[sensitive].to(torch.bfloat16), amax


@pytest.mark.parametrize("squared, scaled_error", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["mae", "mse", "mae-scaled", "mse-scaled"])
def test_four_over_six_sums_the_errors_in_the_references_order(squared, scaled_error):
    """Blocks whose choice another summation order would change: the kernel keeps the reference's."""
    # About 1 block in 15000 for mae, 1 in 150000 for mse.
    blocks, amax = _order_sensitive_blocks(squared, scaled_error, pool=1_000_000 if squared else 200_000)
    assert len(blocks) > 0
    _check_cast(blocks, amax=amax, four_over_six="mse" if squared else "mae", scaled_error=scaled_error)


@triton.jit
def _tile_sums_kernel(ROW_ERRORS, SUMS, DOWN: tl.constexpr, ACROSS: tl.constexpr):
    """nvfp4._tile_sums of ROW_ERRORS [DOWN, 16, ACROSS] into SUMS [DOWN, ACROSS]."""
    offsets = (tl.arange(0, DOWN)[:, None, None] * 16 + tl.arange(0, 16)[None, :, None]) * ACROSS \
        + tl.arange(0, ACROSS)[None, None, :]
    sums = nvfp4._tile_sums(tl.load(ROW_ERRORS + offsets), DOWN, ACROSS)
    tl.store(SUMS + tl.arange(0, DOWN)[:, None] * ACROSS + tl.arange(0, ACROSS)[None, :],
             tl.reshape(sums, (DOWN, ACROSS)))


def test_16x16_tiles_sum_their_row_errors_as_the_references_tree():
    """Tile sums are too far apart for random data to expose the order of their 16 terms: the
    tree on row errors of magnitudes 2^-30 .. 1, where a sequential sum differs."""
    row_errors = torch.rand(2, 16, 2) * 2.0 ** -torch.randint(0, 31, (2, 16, 2)).float()
    tree = row_errors
    while tree.shape[1] > 1:  # the reference's: r + (r + half), halving
        tree = tree[:, :tree.shape[1] // 2] + tree[:, tree.shape[1] // 2:]
    sequential = torch.zeros(2, 2)
    for r in range(16):
        sequential = sequential + row_errors[:, r]
    assert not torch.equal(tree[:, 0], sequential)
    sums = torch.empty(2, 2, device=DEVICE)
    _tile_sums_kernel[(1,)](row_errors.to(DEVICE), sums, DOWN=2, ACROSS=2)
    assert torch.equal(sums.cpu(), tree[:, 0])


def _special_values(dtype: torch.dtype) -> torch.Tensor:
    """Rows of zeros, -0, lone NaN / inf / -inf, a NaN block, subnormals, values near the dtype's
    max, a lone tiny negative (-> code -0), next to ordinary rows."""
    x = torch.randn(20, 48)
    top = torch.finfo(dtype).max
    x[0] = 0.0
    x[1] = -0.0
    x[2, 3], x[3, 5], x[4, 7] = float("nan"), float("inf"), -float("inf")
    x[5, :16] = float("nan")
    x[6, 16:32] = torch.finfo(dtype).tiny / 4
    x[7, 32:] = top
    x[8, 1:16] = 1.0
    x[8, 0] = -1e-3
    return x.to(dtype)


@pytest.mark.parametrize("dtype", list(_CAST_DTYPES), ids=str)
@pytest.mark.parametrize("options", [
    {}, {"sr_rng": torch.tensor([3, 4])}, {"four_over_six": "mae"}, {"four_over_six": "mse", "scaled_error": True},
    {"block_rows": 16, "four_over_six": "mse"}, {"per_row": True}, {"transpose": True, "block_rows": 16}],
    ids=["nearest", "stochastic", "mae", "mse-scaled", "16x16-mse", "per-row", "16x16-transpose"])
def test_zeros_nan_inf_and_subnormals(dtype, options):
    _check_cast(_special_values(_CAST_DTYPES[dtype]), **options)


@pytest.mark.parametrize("amax", [0.0, float("inf"), 1e-30, 3e38], ids=["zero", "inf", "tiny", "huge"])
@pytest.mark.parametrize("four_over_six", ["off", "mae"])
def test_global_amax_at_the_edges(amax, four_over_six):
    """S_enc's corner cases: 6 E / 0 = inf -> FLT_MAX, 6 E / inf = 0 -> 1, overflowing block scales."""
    _check_cast(torch.randn(20, 48), amax=torch.tensor([amax]), four_over_six=four_over_six)


def test_empty_inputs():
    x, amax = torch.empty(0, 32, device=DEVICE), torch.ones(1, device=DEVICE)
    assert torch.equal(nvfp4.nvfp4_amax(x, False, False).cpu(), torch.zeros(1))
    data, scales = nvfp4.nvfp4_quantize(x, amax, 1, False, False, None)
    assert data.shape == (0, 16) and scales.shape == (0, 2)
    assert nvfp4.nvfp4_dequantize(data, scales, amax, 32, torch.bfloat16).shape == (0, 32)


# GEMM ------------------------------------------------------------------------------------------------------------

def _operand(rows: int, k: int):
    """(data, scales on DEVICE, decoded values code * scale in float64) of a random NVFP4 operand
    [rows, k]."""
    x = _spread(rows, k, torch.float32)
    data, scales = spec.nvfp4_quantize(x, spec.nvfp4_amax(x, False, False), 1, False, False, None)
    decoded = spec.nvfp4_dequantize(data, scales, torch.tensor([2688.0]), k, torch.float32)  # factor = the scale
    return data.to(DEVICE), scales.to(DEVICE), decoded.double()


# An fp32 addition's error relative to its result: half an ulp in the interpreter (round to
# nearest), a whole one on the tensor cores, whose additions truncate (Fasi et al., "Numerical
# behavior of NVIDIA tensor cores", 2021).
_ADDITION_ERROR = 2.0 ** -24 if DEVICE.type == "cpu" else 2.0 ** -23


def _half_ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half an ulp of dtype at |values| (float64), subnormals included."""
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(values.abs().clamp(min=info.tiny)))
    return 0.5 * torch.exp2(exponent) * info.eps


@pytest.mark.parametrize("m, n, k, out_dtype", [(3, 5, 16, "fp32"), (37, 69, 272, "bf16"), (130, 129, 80, "fp16")],
                         ids=["3x5x16", "37x69x272", "130x129x80"])
@pytest.mark.parametrize("row_scales, col_scales, bias", [(False, False, False), (True, False, True),
                                                          (True, True, True), (False, True, False)],
                         ids=["alpha", "rows-bias", "rows-cols-bias", "cols"])
def test_gemm_within_fp32_summation_of_the_exact_product(m, n, k, out_dtype, row_scales, col_scales, bias):
    """|out - exact| <= (k + 2) 2^-24 |scales| (|A| @ |B|^T) (the fp32 sums of exact products and
    the two scalings) + 2^-24 |exact| (the bias's addition) + half an ulp of out_dtype, with
    exact = (A @ B^T) * alpha * row_scales * col_scales + bias in float64 (2^-23 on a GPU)."""
    dtype = _CAST_DTYPES[out_dtype]
    (a_data, a_scales, a), (b_data, b_scales, b) = _operand(m, k), _operand(n, k)
    alpha = torch.tensor([2.0 ** -12 if dtype == torch.float16 else 0.37])  # fp16: the sums stay in range
    rows = torch.rand(m) + 0.5 if row_scales else None
    cols = torch.rand(n) + 0.5 if col_scales else None
    shift = torch.randn(n) if bias else None
    on_device = (t.to(DEVICE) if t is not None else None for t in (alpha, rows, cols, shift))
    got = nvfp4_gemm.nvfp4_gemm(a_data, a_scales, b_data, b_scales, k, *on_device, dtype).cpu()
    scales = alpha.double() * (rows.double()[:, None] if row_scales else 1.0) * (cols.double()[None, :] if col_scales
                                                                                  else 1.0)
    exact = (a @ b.T) * scales + (shift.double() if bias else 0.0)
    bound = ((k + 2) * _ADDITION_ERROR * scales.abs() * (a.abs() @ b.abs().T) + _ADDITION_ERROR * exact.abs()
             + _half_ulp(torch.maximum(exact.abs(), got.double().abs()), dtype))
    assert got.dtype == dtype and got.shape == (m, n)
    error = (got.double() - exact).abs()
    assert bool((error <= bound).all()), float((error / bound).max())


def test_gemm_reads_row_strided_operands():
    """Operands that are row slices of larger codes (the kernel walks rows by their stride)."""
    (a_data, a_scales, a), (b_data, b_scales, b) = _operand(40, 64), _operand(24, 64)
    got = nvfp4_gemm.nvfp4_gemm(a_data[::2], a_scales[::2], b_data[1::3], b_scales[1::3], 64,
                                torch.ones(1, device=DEVICE), None, None, None, torch.float32).cpu()
    exact = a[::2] @ b[1::3].T
    assert bool(((got.double() - exact).abs() <= 66 * _ADDITION_ERROR * (a[::2].abs() @ b[1::3].abs().T)).all())


# What the reference serves ---------------------------------------------------------------------------------------

def test_e4m3_casts_and_the_gemm_fall_back_where_the_device_lacks_e4m3(monkeypatch):
    """The scales are E4M3: without its conversion (sm_80, older MUSA parts) only the amax runs."""
    x, amax = torch.ones(4, 64), torch.ones(1)
    data, scales = torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 4, dtype=torch.float8_e4m3fn)
    quantize_args = (x, amax, 1, False, False, None, 448, "off", False)
    gemm_args = (data, scales, data, scales, 64, amax, None, None, None, torch.bfloat16)
    assert nvfp4.supports("nvfp4_quantize", quantize_args)
    assert nvfp4_gemm.supports("nvfp4_gemm", gemm_args)
    monkeypatch.setattr(_device, "has_e4m3", lambda device: False)
    assert nvfp4.supports("nvfp4_amax", (x, False, False, False))
    assert not nvfp4.supports("nvfp4_quantize", quantize_args)
    assert not nvfp4.supports("nvfp4_dequantize", (data, scales, amax, 64, torch.float32, 448))
    assert not nvfp4_gemm.supports("nvfp4_gemm", gemm_args)


def test_rows_longer_than_the_grid_tiles_fall_back():
    """A cast's column tiles lie along the grid's second dimension (at most 65535 of 64 columns)."""
    wide = torch.empty(1, 1).expand(2, 64 * 65535 + 1)  # no memory: a broadcast view
    assert not nvfp4.supports("nvfp4_amax", (wide, False, False, False))
    assert nvfp4.supports("nvfp4_amax", (wide, True, False, False))  # transposed: 2 columns
    assert not nvfp4.supports("nvfp4_quantize", (wide, torch.ones(1), 1, False, False, None, 448, "off", False))


# Builds for sm_90 and sm_100 -------------------------------------------------------------------------------------

_CAST_SIGNATURE = {"n_rows": "i32", "n_cols": "i32", "stride_row": "i32", "stride_col": "i32"}


def _source_strides(transpose: bool) -> dict:
    """A contiguous input's unit stride, specialised by Triton's launch: the columns' of what is
    cast, or its rows' when transposed."""
    return {"stride_row": 1} if transpose else {"stride_col": 1}


def _with_unit_stride(signature: dict, transpose: bool) -> dict:
    return {**signature, **{name: "constexpr" for name in _source_strides(transpose)}}


def amax_variants():
    found = []
    for dtype, transpose, rht, per_row in (("bf16", False, False, False), ("fp32", True, True, True)):
        signature = _with_unit_stride({"X": POINTER[dtype], "PARTIALS": "*fp32", **_CAST_SIGNATURE,
                                       **{name: "constexpr" for name in ("RHT", "NEGATIVE_LANES", "PER_ROW",
                                                                         "TILE_ROWS", "TILE_COLS")}}, transpose)
        constexprs = {"RHT": rht, "NEGATIVE_LANES": nvfp4.RHT_NEGATIVE_LANES, "PER_ROW": per_row,
                      "TILE_ROWS": nvfp4.TILE_ROWS, "TILE_COLS": nvfp4.TILE_COLS, **_source_strides(transpose)}
        found.append((f"amax[{dtype},transpose={transpose},rht={rht},per_row={per_row}]", nvfp4._amax_kernel,
                      signature, constexprs))
    return found


_QUANTIZE_VARIANTS = (  # dtype, block_rows, transpose, rht, row amax, stochastic, 4over6, scaled_error, E
    ("bf16", 1, False, False, False, False, "off", False, 448),
    ("fp32", 16, True, True, False, False, "off", False, 448),
    ("bf16", 1, True, True, False, True, "off", False, 448),
    ("fp16", 1, False, False, True, False, "off", False, 448),
    ("bf16", 1, False, False, False, False, "mae", False, 256),
    ("fp32", 16, False, False, False, False, "mse", True, 256))


def quantize_variants():
    found = []
    for dtype, block_rows, transpose, rht, row_amax, stochastic, four_over_six, scaled_error, e4m3_max in \
            _QUANTIZE_VARIANTS:
        flags = ("E4M3_MAX", "BLOCK_ROWS", "RHT", "NEGATIVE_LANES", "ROW_AMAX", "STOCHASTIC", "FOUR_OVER_SIX",
                 "SCALED_ERROR", "TILE_ROWS", "TILE_COLS")
        signature = _with_unit_stride({"X": POINTER[dtype], "AMAX": "*fp32", "RNG": "*i64", "DATA": "*u8",
                                       "SCALES": POINTER["e4m3"], **_CAST_SIGNATURE, "data_cols": "i32",
                                       "scale_cols": "i32", **{name: "constexpr" for name in flags}}, transpose)
        constexprs = {"E4M3_MAX": e4m3_max, "BLOCK_ROWS": block_rows, "RHT": rht,
                      "NEGATIVE_LANES": nvfp4.RHT_NEGATIVE_LANES, "ROW_AMAX": row_amax, "STOCHASTIC": stochastic,
                      "FOUR_OVER_SIX": nvfp4.FOUR_OVER_SIX[four_over_six], "SCALED_ERROR": scaled_error,
                      "TILE_ROWS": nvfp4.TILE_ROWS, "TILE_COLS": nvfp4.TILE_COLS, **_source_strides(transpose)}
        name = (f"quantize[{dtype},1x16x{block_rows},transpose={transpose},rht={rht},row_amax={row_amax},"
                f"sr={stochastic},4over6={four_over_six},scaled_error={scaled_error},E={e4m3_max}]")
        found.append((name, nvfp4._quantize_kernel, signature, constexprs))
    return found


def dequantize_variants():
    found = []
    for out, row_amax in (("bf16", False), ("fp32", True)):
        signature = {"DATA": "*u8", "SCALES": POINTER["e4m3"], "AMAX": "*fp32", "Y": POINTER[out], "n_rows": "i32",
                     "n_cols": "i32", "inverse_range": "fp32", "ROW_AMAX": "constexpr", "TILE_ROWS": "constexpr",
                     "TILE_COLS": "constexpr"}
        constexprs = {"ROW_AMAX": row_amax, "TILE_ROWS": nvfp4.TILE_ROWS, "TILE_COLS": nvfp4.TILE_COLS}
        found.append((f"dequantize[->{out},row_amax={row_amax}]", nvfp4._dequantize_kernel, signature, constexprs))
    return found


def gemm_variants():
    found = []
    for out, row_scales, col_scales, bias in (("bf16", False, False, False), ("fp32", True, True, True),
                                              ("fp16", False, True, True)):
        flags = ("HAS_ROW_SCALES", "HAS_COL_SCALES", "HAS_BIAS", "DOT_DTYPE", "BLOCK_M", "BLOCK_N", "BLOCK_K")
        signature = {"A": "*u8", "A_SCALES": POINTER["e4m3"], "B": "*u8", "B_SCALES": POINTER["e4m3"],
                     "ALPHA": "*fp32", "ROW_SCALES": "*fp32", "COL_SCALES": "*fp32", "BIAS": "*fp32",
                     "C": POINTER[out], "m": "i32", "n": "i32", "k": "i32", "stride_a": "i32",
                     "stride_a_scales": "i32", "stride_b": "i32", "stride_b_scales": "i32",
                     **{name: "constexpr" for name in flags}}
        constexprs = {"HAS_ROW_SCALES": row_scales, "HAS_COL_SCALES": col_scales, "HAS_BIAS": bias,
                      "DOT_DTYPE": tl.bfloat16, "BLOCK_M": nvfp4_gemm.BLOCK_M, "BLOCK_N": nvfp4_gemm.BLOCK_N,
                      "BLOCK_K": nvfp4_gemm.BLOCK_K}
        found.append((f"gemm[->{out},row_scales={row_scales},col_scales={col_scales},bias={bias}]",
                      nvfp4_gemm._nvfp4_gemm_kernel, signature, constexprs))
    return found


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/nvfp4.py and nvfp4_gemm.py: the amax
    (plain; transposed, transformed, per row), 6 casts (1x16 and 16x16, transpose + rht, stochastic
    rounding, row amaxes, 4over6 mae / mse with scaled errors and E = 256), dequantization to bf16
    and fp32, and the GEMM to bf16, fp32 and fp16 with and without row / column scales and bias."""
    return amax_variants() + quantize_variants() + dequantize_variants() + gemm_variants()


def test_kernels_compile_for_hopper_and_blackwell():
    """Every variant builds for sm_90 and sm_100 with no float64; the casts' FP8 conversions
    (E4M3 scales) saturate and their divisions are correctly rounded; the GEMM multiplies on the
    tensor cores (wgmma / tcgen05)."""
    report = compile_report(compile_variants)
    assert len(report) == 2 * len(compile_variants())
    for entry in report:
        assert entry["cubin_bytes"] > 0 and not entry["float64"], entry
        assert entry["fp8_saturating"] == entry["fp8_converts"], entry
        assert not entry["inexact_divisions"], entry
        kind = entry["kernel"].partition("[")[0]
        assert (entry["fp8_converts"] > 0) == (kind == "quantize"), entry
        assert (entry["tensor_core_mma"] > 0) == (kind == "gemm"), entry


def unfused_variants():
    """The variants whose products feed sums (4over6's errors, the GEMM's bias)."""
    return [variant for variant in compile_variants() if "4over6=m" in variant[0] or "bias=True" in variant[0]]


# Compiles the variants a test file's function lists for sm_90 with the kernels' launch options
# and prints the count of fp32 FMAs in each one's PTX.
_COUNT_FMAS = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_compile import aligned, listed_variants
options = json.loads(sys.argv[2])
counts = {}
for name, kernel, signature, constexprs in listed_variants(sys.argv[1]):
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned(kernel, signature))
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    counts[name] = len(re.findall(r"\\bfma\\.rn(?:\\.ftz)?\\.f32\\b", ptx))
print(json.dumps(counts))
"""


def test_products_are_rounded_before_the_sums_they_feed():
    """Launched as the kernels are (enable_fp_fusion=False, which Triton 3.9 does not default to),
    no product is fused into an FMA: 4over6's d * d + error and the scaled error's
    value * scale - x * S_enc round as the reference's, as does the GEMM's (acc * alpha) + bias."""
    assert nvfp4._LAUNCH["enable_fp_fusion"] is False and nvfp4_gemm._LAUNCH["enable_fp_fusion"] is False
    helpers = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [helpers, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", _COUNT_FMAS, f"{__file__}::unfused_variants",
                             json.dumps({"enable_fp_fusion": False})], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(counts) == 4 and not any(counts.values()), counts
