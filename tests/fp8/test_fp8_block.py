"""Block-scaled FP8 (Float8BlockScaling 1x128 / 128x128, MXFP8 1x32 with E8M0 scales): the
cast ops bit-exact against the reference on every CPU SIMD tier, scale rules, SQNR, errors; the
recipes' layouts; te.Linear under both recipes against a quantise-dequantise emulation
(opcheck and torch.compile of the ops: the op cases at the end)."""
import math

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.tensor.for_recipe import block_quantizer
from backends import assert_refused
from numerics import assert_same_fp8, assert_fp8_gemm_result, fp32_quotient, sqnr_db
from op_cases import F32, OpCases, basic_inputs, randn

ops = torch.ops.portable_te
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

LAYOUTS = [((1, 128), "pow2"), ((1, 128), "fp32"), ((128, 128), "pow2"), ((128, 1), "pow2"), ((1, 32), "e8m0"),
           ((32, 1), "e8m0")]
LAYOUT_IDS = [f"{b[0]}x{b[1]}-{m}" for b, m in LAYOUTS]


def wide_range(rows, cols, dtype):
    """Magnitudes over twelve decades (every block gets its own scale), a huge outlier, an
    inf and a NaN in different blocks."""
    x = torch.randn(rows, cols) * torch.logspace(-6, 6, cols)
    if x.numel() > 2000:
        x[1, 5], x[-1, -1], x[-2, cols // 2] = 1e30, math.inf, math.nan
    return x.to(dtype)


def assert_same_scales(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    view = torch.uint8 if got.dtype == torch.uint8 else torch.int32
    assert torch.equal(got.view(view), want.view(view)), (got.view(view) != want.view(view)).nonzero()[:5]


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block, mode", LAYOUTS, ids=LAYOUT_IDS)
def test_quantize_and_dequantize_bit_exact_on_every_tier(cpu_tier, fp8_dtype, dtype, block, mode):
    check_bit_exact(fp8_dtype, dtype, block, mode, "cpu")


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block, mode", LAYOUTS, ids=LAYOUT_IDS)
def test_quantize_and_dequantize_bit_exact_on_every_backend(backend, fp8_dtype, dtype, block, mode):
    check_bit_exact(fp8_dtype, dtype, block, mode, backend.device)


def check_bit_exact(fp8_dtype, dtype, block, mode, device):
    x = wide_range(300, 260, dtype).to(device)
    data, scale_inv = ops.fp8_block_quantize(x, block[0], block[1], fp8_dtype, mode, 0.0)
    want, want_scale_inv = reference.fp8_block_quantize(x, block[0], block[1], fp8_dtype, mode, 0.0)
    assert_same_fp8(data, want)
    assert_same_scales(scale_inv, want_scale_inv)
    assert scale_inv.shape == (-(-300 // block[0]), -(-260 // block[1]))
    for out_dtype in (torch.float32, dtype):
        got = ops.fp8_block_dequantize(data, scale_inv, block[0], block[1], out_dtype)
        expected = reference.fp8_block_dequantize(want, want_scale_inv, block[0], block[1], out_dtype)
        assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0))


@pytest.mark.parametrize("block, mode", [((1, 32), "e8m0"), ((1, 128), "pow2")], ids=["1x32-e8m0", "1x128-pow2"])
def test_row_blocks_bit_exact_with_streamed_output(cpu_tier, block, mode):
    """16 MiB of codes: the row-block kernels write them with streaming stores."""
    x = wide_range(4096, 4096, torch.bfloat16)
    data, scale_inv = ops.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    want, want_scale_inv = reference.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    assert_same_fp8(data, want)
    assert_same_scales(scale_inv, want_scale_inv)


@pytest.mark.parametrize("block, mode", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", [(0, 64), (5, 0), (1, 1), (129, 33), (3, 1025)], ids=str)
def test_odd_and_empty_shapes(backend, block, mode, shape):
    x = torch.randn(shape, dtype=torch.bfloat16, device=backend.device) * 3
    data, scale_inv = ops.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    want, want_scale_inv = reference.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    assert_same_fp8(data, want)
    assert_same_scales(scale_inv, want_scale_inv)


def test_non_contiguous_input_and_epsilon(backend):
    x = (torch.randn(256, 64, device=backend.device) * 1e-3).t()
    x[:, :128] = 0.0  # all-zero blocks: the epsilon bounds their amax
    data, scale_inv = ops.fp8_block_quantize(x, 1, 128, E4M3, "fp32", 1e-2)
    want, want_scale_inv = reference.fp8_block_quantize(x.contiguous(), 1, 128, E4M3, "fp32", 1e-2)
    assert_same_fp8(data, want)
    assert_same_scales(scale_inv, want_scale_inv)
    assert torch.equal(scale_inv[:, 0].cpu(), torch.reciprocal(fp32_quotient(448.0, 1e-2)).expand(64))


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("block, mode", LAYOUTS, ids=LAYOUT_IDS)
def test_saturation_and_nan_stay_finite_and_local(backend, fp8_dtype, block, mode):
    fp8_max = torch.finfo(fp8_dtype).max
    x = torch.randn(256, 256, device=backend.device)
    x[0, 0], x[200, 200], x[100, 100] = math.inf, -1e38, math.nan
    data, scale_inv = ops.fp8_block_quantize(x, block[0], block[1], fp8_dtype, mode, 0.0)
    values = data.float()
    nan_codes = torch.isnan(values)
    assert nan_codes.sum() == 1, "a NaN is its own code only: its block's amax skips it"
    assert values[~nan_codes].abs().max() <= fp8_max
    assert values[0, 0] == fp8_max, "inf saturates"
    # the huge value is its block's amax: mapped to -fp8_max, or within a factor 2 of it
    # when the scale is rounded down to a power of two
    assert -fp8_max <= values[200, 200] <= (-fp8_max if mode == "fp32" else -fp8_max / 2)
    finite_scales = torch.isfinite(scale_inv.float()) if mode != "e8m0" else scale_inv != 255
    assert finite_scales.sum() >= scale_inv.numel() - 1


@pytest.mark.parametrize("block, mode", LAYOUTS, ids=LAYOUT_IDS)
def test_round_trip_sqnr(block, mode):
    x = torch.randn(512, 384) * torch.logspace(-3, 3, 384)
    data, scale_inv = ops.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    assert sqnr_db(x, ops.fp8_block_dequantize(data, scale_inv, block[0], block[1], torch.float32)) >= 25


def test_mxfp8_scales_are_rounded_up_powers_of_two(backend):
    x = torch.zeros(1, 96, device=backend.device)
    x[0, :32], x[0, 32:64], x[0, 64:] = 448.0, 449.0, 0.0
    data, exponents = ops.fp8_block_quantize(x, 1, 32, E4M3, "e8m0", 0.0)
    assert exponents.tolist() == [[127, 128, 0]]
    assert data.float()[0, 0] == 448.0 and data.float()[0, 32] == 224.0 and data.float()[0, 64] == 0.0


def layout_of(rec, role):
    return block_quantizer(rec, role).block_layout


def test_block_layouts_of_the_recipes():
    default = recipe.Float8BlockScaling()
    assert layout_of(default, "input") == ((1, 128), (128, 1), "pow2", 0.0)
    assert layout_of(default, "weight") == ((128, 128), (128, 128), "pow2", 0.0)
    assert layout_of(default, "grad") == ((1, 128), (128, 1), "pow2", 0.0)
    fp32_scales = recipe.Float8BlockScaling(use_power_2_scales=False, x_block_scaling_dim=2, amax_epsilon=1e-6)
    assert layout_of(fp32_scales, "input") == ((128, 128), (128, 128), "fp32", 1e-6)
    for role in ("input", "weight", "grad"):
        assert layout_of(recipe.MXFP8BlockScaling(), role) == ((1, 32), (32, 1), "e8m0", 0.0)
    with pytest.raises(ValueError, match="not a block-scaling recipe"):
        layout_of(recipe.DelayedScaling(), "input")


@pytest.mark.parametrize("call, words", [
    (lambda: ops.fp8_block_quantize(torch.randn(4, 8), 1, 32, E4M3, "e4m3", 0.0), ["scale_mode", "e4m3"]),
    (lambda: ops.fp8_block_quantize(torch.randn(2, 4, 8), 1, 32, E4M3, "e8m0", 0.0), ["input", "2-D", "[2, 4, 8]"]),
    (lambda: ops.fp8_block_quantize(torch.randn(4, 8), 0, 32, E4M3, "e8m0", 0.0), ["0 x 32"]),
    (lambda: ops.fp8_block_quantize(torch.randn(4, 8), 1, 32, torch.bfloat16, "pow2", 0.0), ["fp8_dtype"]),
    (lambda: ops.fp8_block_quantize(torch.randn(4, 8), 1, 32, E4M3, "pow2", -1.0), ["amax_epsilon", "-1"]),
    (lambda: ops.fp8_block_dequantize(torch.zeros(4, 64, dtype=E4M3), torch.ones(4, 3), 1, 32, torch.float32),
     ["scale_inv", "[4, 3]", "[4, 2]"]),
    (lambda: ops.fp8_block_dequantize(torch.zeros(4, 64, dtype=E4M3), torch.ones(4, 2, dtype=torch.int32), 1, 32,
                                      torch.float32), ["scale_inv", "Int"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python, custom_ops/_fp8_checks.py)
    and in the fake kernels torch.compile traces with (meta tensors)."""
    assert_refused(backend, call, words)


# --- te.Linear under the block recipes ---------------------------------------------------

def qdq(t, block, mode, fp8_dtype):
    data, scale_inv = reference.fp8_block_quantize(t, block[0], block[1], fp8_dtype, mode, 0.0)
    return reference.fp8_block_dequantize(data, scale_inv, block[0], block[1], torch.float32)


BLOCK_RECIPES = [recipe.Float8BlockScaling(), recipe.Float8BlockScaling(fp8_format=recipe.Format.HYBRID,
                                                                        use_power_2_scales=False,
                                                                        x_block_scaling_dim=2),
                 recipe.MXFP8BlockScaling(), recipe.MXFP8BlockScaling(fp8_format=recipe.Format.HYBRID)]
BLOCK_IDS = ["block-default", "block-hybrid-fp32-x2d", "mxfp8", "mxfp8-hybrid"]


@pytest.mark.parametrize("rec", BLOCK_RECIPES, ids=BLOCK_IDS)
def test_linear_equals_block_emulation(rec, cpu_gemm):
    """y = Q(x) Q(W)^T + b with row-wise blocks; dgrad = Q(dy) Q'(W) and wgrad = Q'(dy)^T Q'(x)
    with the column-wise blocks along the tokens / output features."""
    torch.manual_seed(3)
    m = te.Linear(300, 136)  # ragged blocks in every direction
    x, dy = torch.randn(257, 300) * torch.logspace(-2, 2, 300), torch.randn(257, 136) * 1e-4
    w = m.weight.detach()
    fwd, bwd = rec.fp8_format.dtype(False), rec.fp8_format.dtype(True)
    lx, lw, lg = (layout_of(rec, role) for role in ("input", "weight", "grad"))
    xr = x.clone().requires_grad_()
    with te.autocast(recipe=rec):
        y = m(xr)
    y.backward(dy)
    assert_fp8_gemm_result(y, qdq(x, lx.rowwise, lx.scale_mode, fwd), qdq(w, lw.rowwise, lw.scale_mode, fwd),
                           m.bias.detach(), name="y")
    assert_fp8_gemm_result(xr.grad, qdq(dy, lg.rowwise, lg.scale_mode, bwd),
                           qdq(w, lw.columnwise, lw.scale_mode, fwd).t(), name="grad_input")
    assert_fp8_gemm_result(m.weight.grad, qdq(dy, lg.columnwise, lg.scale_mode, bwd).t(),
                           qdq(x, lx.columnwise, lx.scale_mode, fwd).t(), name="grad_weight")


@pytest.mark.parametrize("rec", BLOCK_RECIPES, ids=BLOCK_IDS)
def test_linear_forward_sqnr_and_fp8_saved_activations(rec):
    torch.manual_seed(2)
    m = te.Linear(256, 128)
    x = torch.randn(64, 256, requires_grad=True)
    exact = m(x)
    with te.autocast(recipe=rec):
        y = m(x)
    assert sqnr_db(exact, y) >= 18
    assert type(y.grad_fn).__name__ == "LinearFunctionBackward"  # a 2-D input's output: no view after it
    saved = y.grad_fn.saved_tensors
    assert not any(t.dtype == torch.float32 and t.numel() == 64 * 256 for t in saved), "x is kept in FP8 only"
    assert any(t.dtype == torch.float8_e4m3fn and t.shape == (64, 256) for t in saved)


def test_linear_bf16_3d_and_zero_tokens_under_mxfp8():
    m = te.Linear(64, 32, params_dtype=torch.bfloat16)
    for shape in ((2, 3, 64), (0, 64)):
        x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            y = m(x)
        y.float().sum().backward()
        assert y.shape == (*shape[:-1], 32) and y.dtype == torch.bfloat16 and x.grad.shape == x.shape


@pytest.mark.parametrize("block, mode", [((1, 32), "e8m0"), ((128, 128), "pow2"), ((32, 1), "e8m0")])
def test_rows_of_a_block_tensor_are_the_cast_of_those_rows(block, mode):
    """Float8BlockTensor.rows (the sequence-parallel GEMM's own and remote rows): the codes and
    block scales of rows [start, stop) equal the cast of those rows alone; a start inside a
    block row, or a transposed view, is refused, naming the rows and the blocks."""
    from transformer_engine.pytorch.fp8.block_tensor import Float8BlockTensor
    x = torch.randn(256, 160)
    whole = Float8BlockTensor.quantize(x, block, E4M3, mode)
    start, stop = block[0], 3 * block[0] if block[0] > 1 else 77
    part, alone = whole.rows(start, stop), Float8BlockTensor.quantize(x[start:stop], block, E4M3, mode)
    assert torch.equal(part.data, alone.data) and torch.equal(part.scale_inv, alone.scale_inv)
    assert torch.equal(part.dequantize(), alone.dequantize())
    if block[0] > 1:
        with pytest.raises(ValueError, match=r"rows \[1, 40\).*\(256, 160\)"):
            whole.rows(1, 40)
    with pytest.raises(ValueError, match="transposed"):
        whole.t().rows(0, block[1])


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("fp8_block")


@CASES.case("fp8_block_quantize")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (x, 1, 32, E4M3, "e8m0", 0.0), (0,)


@CASES.case("fp8_block_dequantize")
def _(d):
    x, _, _, _ = basic_inputs(d)
    codes, scales = ops.fp8_block_quantize(x.float(), 1, 32, E4M3, "e8m0", 0.0)
    return (codes, scales, 1, 32, F32), ()


# Block scaling: bf16 [70, 160] (ragged blocks in both directions) in 1 x 128 power-of-two
# scales and 1 x 32 E8M0 ones, and back.
for _block, _mode in (((1, 128), "pow2"), ((1, 32), "e8m0")):
    _t = f"bf16, 70x160, {_block[0]}x{_block[1]} {_mode}"

    @CASES.case(f"fp8_block_quantize[{_t}]", compile=False)
    def _(d, block=_block, mode=_mode):
        return (randn(d, 70, 160), *block, E4M3, mode, 0.0), (0,)

    @CASES.case(f"fp8_block_dequantize[{_t}]", compile=False)
    def _(d, block=_block, mode=_mode):
        data, scale_inv = ops.fp8_block_quantize(randn(d, 70, 160), *block, E4M3, mode, 0.0)
        return (data, scale_inv, *block, F32), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
