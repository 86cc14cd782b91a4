"""NaN never enters an amax (issue 18, item 4): every amax has fmaxf semantics, as
TransformerEngine's reductions (scaling.py's docstring). NaN elements are skipped, inf
counts, NaNs alone give 0, and the NaN elements still cast to NaN codes. Each op that
produces an amax is checked on every CPU tier and input dtype, bit for bit against its
reference; then the scenario that made this matter: one NaN step under DelayedScaling."""
import math

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.fp8 import scaling
from transformer_engine.pytorch.reference.fp8_block import block_grid
from numerics import assert_same_fp8

ops = torch.ops.portable_te
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
E4M3 = torch.float8_e4m3fn


def with_nans(x: torch.Tensor) -> torch.Tensor:
    """x with NaNs at the first element, in the middle (a vector body) and at the end (a
    scalar tail) of every row."""
    x = x.clone()
    cols = x.shape[-1]
    for j in (0, cols // 2, cols - 1):
        x[..., j] = math.nan
    return x


def finite_amax(x: torch.Tensor) -> float:
    values = x.float().abs()
    values = values[~torch.isnan(values)]
    return values.max().item() if values.numel() else 0.0


def cases(dtype, rows=5, cols=131):
    """(name, x, expected amax): NaN among finite values, NaN beside inf, NaN alone."""
    base = with_nans(torch.randn(rows, cols) * 7).to(dtype)
    with_inf = base.clone()
    with_inf[1, 3] = -math.inf
    return [("nan", base, finite_amax(base)), ("inf", with_inf, math.inf),
            ("all_nan", torch.full((rows, cols), math.nan, dtype=dtype), 0.0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_quantize_amax_skips_nan(cpu_tier, dtype):
    for name, x, want in cases(dtype):
        data, amax = ops.fp8_quantize(x, torch.tensor([2.0]), E4M3)
        ref_data, ref_amax = reference.fp8_quantize(x, torch.tensor([2.0]), E4M3)
        assert amax.item() == want == ref_amax.item(), name
        assert_same_fp8(data, ref_data)
        assert torch.isnan(data.float()).sum() == torch.isnan(x.float()).sum(), "NaN elements stay NaN codes"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_quantize_transpose_amax_skips_nan(cpu_tier, dtype):
    for name, x, want in cases(dtype, rows=67, cols=131):
        data, data_t, amax = ops.fp8_quantize_transpose(x, torch.tensor([0.5]), E4M3)
        ref_data, ref_t, ref_amax = reference.fp8_quantize_transpose(x, torch.tensor([0.5]), E4M3)
        assert amax.item() == want == ref_amax.item(), name
        assert_same_fp8(data, ref_data)
        assert_same_fp8(data_t, ref_t)


@pytest.mark.parametrize("block,mode", [((1, 128), "pow2"), ((128, 128), "fp32"), ((1, 32), "e8m0"),
                                        ((32, 1), "e8m0"), ((128, 1), "pow2")], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_block_amax_skips_nan(cpu_tier, dtype, block, mode):
    x = (torch.randn(260, 300) * 5).to(dtype)
    x[0, 0] = x[130, 7] = x[259, 299] = math.nan   # NaN among finite values
    x[:, 140:150] = math.nan                         # whole NaN blocks for the 1 x n and n x 1 shapes
    x[5, 200] = math.inf
    data, scale_inv = ops.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    ref_data, ref_scale_inv = reference.fp8_block_quantize(x, block[0], block[1], E4M3, mode, 0.0)
    assert torch.equal(scale_inv, ref_scale_inv)
    assert_same_fp8(data, ref_data)
    # Each block's scale is the one of its finite amax: no NaN scale anywhere.
    grid = block_grid(260, 300, *block)
    padded = torch.nn.functional.pad(x.float(), (0, grid[1] * block[1] - 300, 0, grid[0] * block[0] - 260))
    blocks = padded.reshape(grid[0], block[0], grid[1], block[1])
    amax = scaling.amax(blocks, dim=(1, 3))
    if mode == "e8m0":
        assert torch.equal(scale_inv, scaling.e8m0_exponent(amax, 448.0))
    else:
        assert torch.equal(scale_inv, torch.reciprocal(scaling.current_scale(amax, 448.0, power_2=mode == "pow2")))
    assert not torch.isnan(scale_inv.float()).any()


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_fp8_amax_skips_nan(cpu_tier, kind, dtype):
    cols = 131
    weight = torch.rand(cols).to(dtype) + 0.5
    bias = torch.randn(cols).to(dtype)
    x = (torch.randn(6, cols) * 3).to(dtype)
    x[2, 7] = math.nan  # row 2 of y is NaN: the amax is that of the other rows
    inf_weight = weight.clone()
    inf_weight[9] = math.inf  # y = inf * xhat in column 9
    runs = [(x, weight, None), (x, inf_weight, math.inf), (torch.full_like(x, math.nan), weight, 0.0)]
    for xs, w, want in runs:
        scale = torch.tensor([4.0])
        if kind == "layernorm":
            got = ops.layernorm_fp8_fwd(xs, w, bias, scale, E4M3, 1e-5, False, True)
            ref = reference.layernorm_fp8_fwd(xs, w, bias, scale, E4M3, 1e-5, False, True)
        else:
            got = ops.rmsnorm_fp8_fwd(xs, w, scale, E4M3, 1e-5, False, True)
            ref = reference.rmsnorm_fp8_fwd(xs, w, scale, E4M3, 1e-5, False, True)
        # The kernel's y may differ from the reference's by an ulp: each amax against its own y.
        data, amax, y = got[0], got[1], got[-1]
        assert amax.item() == (finite_amax(y) if want is None else want)
        assert ref[1].item() == (finite_amax(ref[-1]) if want is None else want)
        assert_same_fp8(data, reference.fp8_quantize(y, scale, E4M3)[0])


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_activation_fp8_amax_skips_nan(cpu_tier, activation, dtype):
    for name, x, _ in cases(dtype, rows=4, cols=262):
        if name == "inf":
            x[1, 3] = math.inf  # +inf: an inf output for all three (x or x * the linear half)
            x[1, 134] = 1.0
        data, amax = ops.activation_fp8(x, None, activation, 7.0, 1.702, torch.tensor([1.5]), E4M3)
        ref_data, ref_amax = reference.activation_fp8(x, None, activation, 7.0, 1.702, torch.tensor([1.5]), E4M3)
        y = reference.activation_fwd(x, None, activation, 7.0, 1.702)
        assert amax.item() == ref_amax.item() == finite_amax(y), name
        assert_same_fp8(data, ref_data)


def test_scaling_amax_and_history_max_skip_nan():
    x = torch.tensor([[1.0, math.nan, -3.0], [math.nan, math.nan, math.nan]])
    assert scaling.amax(x).item() == 3.0
    assert torch.equal(scaling.amax(x, dim=1), torch.tensor([3.0, 0.0]))
    assert scaling.amax(torch.tensor([math.nan, -math.inf])).item() == math.inf
    assert scaling.amax(torch.empty(0, 4)).item() == 0.0
    history = torch.tensor([[math.nan, 2.0], [5.0, math.inf], [1.0, 1.0]])
    assert torch.equal(scaling.compute_amax(history, "max"), torch.tensor([5.0, math.inf]))


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=str)
def test_scaling_amax_of_a_whole_tensor_is_max_magnitude_in_each_case(dtype):
    """Current scaling's amax (the whole tensor): one pass without NaN, the NaN-skipping pass with
    one; the largest magnitude negative or positive, inf counted."""
    x = (torch.randn(300, 77) * 5).to(dtype)
    x[7, 7] = -1000.0  # the largest magnitude is negative
    assert scaling.amax(x).item() == 1000.0 and scaling.amax(x).dtype == torch.float32
    assert scaling.amax(-x).item() == 1000.0
    for name, tensor, want in cases(dtype):
        assert scaling.amax(tensor).item() == want, name
    assert scaling.amax(torch.tensor([-math.inf, 1.0], dtype=dtype)).item() == math.inf


def test_one_nan_step_does_not_freeze_delayed_scaling():
    """A te.Linear under DelayedScaling: one step with a NaN in its input, then clean steps
    with inputs of about 950. The input's scale must follow them (448 / 950, not stay at the
    scale of the inputs of about 1 before), so the cast does not saturate at 448."""
    torch.manual_seed(0)
    linear = te.Linear(64, 32, params_dtype=torch.float32)
    rec = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")

    def step(x):
        with te.autocast(recipe=rec):
            out = linear(x)
        out.float().sum().backward()
        return out

    for _ in range(2):
        step(torch.randn(8, 64))
    poisoned = torch.randn(8, 64)
    poisoned[3, 5] = math.nan
    step(poisoned)
    big = torch.randn(8, 64) * 950
    for _ in range(3):
        out = step(big)
    scale = linear.fp8_meta["scaling_fwd"].scale[0].item()
    assert not math.isnan(scale)
    amax = big.abs().max().item()
    assert scale * amax == pytest.approx(448.0, rel=1e-6), (scale, amax)  # fp8_max / the history's max
    want = big @ linear.weight.detach().t() + linear.bias.detach()
    rel = ((out - want).norm() / want.norm()).item()
    assert rel < 0.1, f"the output of a saturated cast: relative error {rel:.3f}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_current_scaling_and_calibration_skip_nan(dtype):
    """The amaxes taken in Python: current scaling's (from the tensor being cast), calibration's
    (te.autocast(enabled=False, calibrating=True)) and quantised weights' (quantized_model_init
    with current scaling). A NaN in the input must leave them at the finite values' max."""
    torch.manual_seed(0)
    x = torch.randn(16, 64, dtype=dtype) * 3
    x[2, 7] = math.nan
    finite_amax = x.float().nan_to_num(0.0).abs().max()
    linear = te.Linear(64, 32, params_dtype=dtype)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        linear(x)
    assert linear.fp8_meta["scaling_fwd"].amax_history[0, 0] == finite_amax
    calibrated = te.Linear(64, 32, params_dtype=dtype)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling()):
        calibrated(x)
    # the update at the autocast's exit has rolled the history: the amax is in its last row
    assert calibrated.fp8_meta["scaling_fwd"].amax_history[-1, 0] == finite_amax
    grouped = te.GroupedLinear(2, 64, 32, params_dtype=dtype)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling()):
        grouped(x, [8, 8])
    history = grouped.fp8_meta["scaling_fwd"].amax_history[-1]
    assert history[0] == finite_amax and history[1] == x[8:].float().abs().max()


def test_quantized_weight_scale_skips_nan():
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        linear = te.Linear(64, 32)
    weight = torch.randn(32, 64)
    weight[0, 0] = math.nan
    with torch.no_grad():
        linear.weight.copy_(weight)
    finite_amax = weight.nan_to_num(0.0).abs().max().item()
    # scale = 448 / amax: the largest weight casts to the code 448 and comes back as itself
    # (a NaN amax would leave the scale at 1: 3.75 for 3.735)
    assert linear.weight.dequantize().nan_to_num(0.0).abs().max().item() == pytest.approx(finite_amax, rel=1e-6)
