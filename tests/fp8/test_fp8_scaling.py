"""FP8 scaling math, bit-exact against TE_API.md section 4's formulas."""
import math

import pytest
import torch

from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8 import scaling

from numerics import fp32_quotient

FLT_MAX = torch.finfo(torch.float32).max


def fp32(*values):
    return torch.tensor(values, dtype=torch.float32)


def run_steps(amaxes, rec, fp8_max, slots=1):
    """Drives one slot through steps: each step max-accumulates its amax into row 0, then
    updates. Returns the scale after each step."""
    history = torch.zeros(rec.amax_history_len, slots)
    scale = torch.ones(slots)
    scales = []
    for amax in amaxes:
        history[0] = torch.maximum(history[0], fp32(amax))
        history, scale = scaling.update_delayed_scaling(history, scale, fp8_max, rec)
        scales.append(scale.clone())
    return scales


def test_worked_check_margin_2_hybrid_history_8():
    """Input scale = (448 / max amax so far) / 4 and grad-output scale = (57344 / max so far) / 4,
    bit for bit, while the history still holds every step; later the window is 8 steps."""
    rec = recipe.DelayedScaling(margin=2, fp8_format=recipe.Format.HYBRID, amax_history_len=8)
    g = torch.Generator().manual_seed(0)
    x_amax = (torch.rand(20, generator=g) * 10).tolist()
    dy_amax = (torch.rand(20, generator=g) * 1e-3).tolist()
    for amaxes, fp8_max in ((x_amax, rec.fp8_format.value.max_fwd), (dy_amax, rec.fp8_format.value.max_bwd)):
        for k, scale in enumerate(run_steps(amaxes, rec, fp8_max)):
            window = amaxes[max(0, k - 7): k + 1]
            expected = fp32_quotient(fp8_max, fp32(max(window))) / 4
            assert torch.equal(scale, expected), (k, scale, expected)


def test_most_recent_uses_only_the_live_row():
    rec = recipe.DelayedScaling(amax_history_len=4, amax_compute_algo="most_recent")
    scales = run_steps([8.0, 2.0, 16.0, 1.0], rec, 448.0)
    for amax, scale in zip([8.0, 2.0, 16.0, 1.0], scales):
        assert torch.equal(scale, fp32_quotient(448.0, fp32(amax)))


def test_history_roll_moves_the_live_row_to_the_end_and_zeroes_row_0():
    history = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 1
    rolled = scaling.roll_amax_history(history)
    assert torch.equal(rolled[0], torch.zeros(3))
    assert torch.equal(rolled[1:3], history[2:4])
    assert torch.equal(rolled[3], history[0])
    assert torch.equal(history[0], fp32(1, 2, 3)), "the input history is not modified"


def test_amax_is_taken_before_the_roll():
    rec = recipe.DelayedScaling(amax_history_len=2)
    history = fp32(7.0, 0.0).reshape(2, 1)  # live amax 7 in row 0
    _, scale = scaling.update_delayed_scaling(history, torch.ones(1), 448.0, rec)
    assert torch.equal(scale, fp32_quotient(448.0, fp32(7.0)))


@pytest.mark.parametrize("amax, expect_previous", [
    (0.0, True), (math.inf, True), (-math.inf, True), (math.nan, True), (3.0, False)])
def test_zero_inf_nan_amax_keep_the_previous_scale(amax, expect_previous):
    previous = fp32(5.0)
    scale = scaling.delayed_scale(fp32(amax), previous, 448.0, 0)
    assert torch.equal(scale, previous if expect_previous else fp32_quotient(448.0, fp32(amax)))


def test_tiny_amax_gives_flt_max_not_inf():
    scale = scaling.delayed_scale(fp32(1e-45), fp32(1.0), 57344.0, 0)
    assert torch.equal(scale, fp32(FLT_MAX))


def test_callable_algorithms():
    rec = recipe.DelayedScaling(amax_history_len=3, amax_compute_algo=lambda h: h.sum(dim=0),
                                scaling_factor_compute_algo=lambda amax, scale, fp8_max, r: fp8_max / amax / 8)
    history = fp32(1.0, 2.0, 3.0).reshape(3, 1)
    _, scale = scaling.update_delayed_scaling(history, torch.ones(1), 448.0, rec)
    assert torch.equal(scale, 448.0 / fp32(6.0) / 8)


def test_slots_are_independent():
    rec = recipe.DelayedScaling(amax_history_len=4)
    history = torch.zeros(4, 3)
    history[0] = fp32(2.0, 0.0, math.nan)
    _, scale = scaling.update_delayed_scaling(history, fp32(1.0, 9.0, 4.0), 448.0, rec)
    assert torch.equal(scale, torch.stack([fp32_quotient(448.0, fp32(2.0))[0], fp32(9.0)[0], fp32(4.0)[0]]))


def test_current_scale_rules():
    amax = fp32(2.0, 0.0, math.inf, math.nan, 1e-45, 448.0)
    scale = scaling.current_scale(amax, 448.0)
    assert torch.equal(scale, torch.cat([fp32_quotient(448.0, fp32(2.0)), fp32(1.0, 1.0, 1.0), fp32(FLT_MAX), fp32(1.0)]))
    assert torch.equal(scaling.current_scale(fp32(0.0, 1e-6), 448.0, amax_epsilon=1e-3),
                       fp32_quotient(448.0, fp32(1e-3, 1e-3)))


def test_power_of_2_scales_round_down():
    amax = fp32(1.0, 3.0, 448.0, 500.0, 1e-45)
    scale = scaling.current_scale(amax, 448.0, power_2=True)
    assert torch.equal(scale, fp32(256.0, 128.0, 1.0, 0.5, 2.0 ** 127))
    for s, a in zip(scale.tolist(), amax.tolist()):
        assert s * a <= 448.0 or a < 1e-30


def test_e8m0_exponent_rounds_up_so_nothing_saturates():
    amax = torch.tensor([448.0, 449.0, 896.0, 897.0, 1.0, 0.0, math.inf, math.nan, 3e-38], dtype=torch.float32)
    exponent = scaling.e8m0_exponent(amax, 448.0)
    assert exponent.dtype == torch.uint8
    assert exponent[:5].tolist() == [127, 128, 128, 129, 119]
    assert exponent[5:8].tolist() == [0, 254, 255]
    scale_inv = scaling.e8m0_to_float(exponent)
    finite = torch.isfinite(amax) & (amax > 0)
    assert torch.all(amax[finite] / scale_inv[finite] <= 448.0)
    # and the smallest such power of two that E8M0 can hold (2^-127 is its floor)
    above_floor = finite & (exponent > 0)
    assert torch.all(amax[above_floor] / (scale_inv[above_floor] / 2) > 448.0)


def test_e8m0_to_float():
    e = torch.tensor([0, 126, 127, 128, 254, 255], dtype=torch.uint8)
    values = scaling.e8m0_to_float(e)
    assert values[:5].tolist() == [2.0 ** -127, 0.5, 1.0, 2.0, 2.0 ** 127]
    assert math.isnan(values[5].item())
