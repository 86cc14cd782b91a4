"""DelayedScaling's update as one op over many FP8 states (custom_ops/delayed_scaling.py) and
the autocast exit that runs it (fp8/state.py: update_together): bit for bit the update of
scaling.py's pure functions, one state at a time, on every backend; the op's cases at the end."""
import math

import pytest
import torch

import transformer_engine.pytorch as te
from numerics import assert_value_error_naming
from op_cases import OpCases
from transformer_engine.common import recipe
from transformer_engine.pytorch import reference, scaling
from transformer_engine.pytorch.fp8.state import BACKWARD, FORWARD, update_together

ops = torch.ops.portable_te


def states(device, history_lens=(1, 4, 1024), slots=(3, 2, 5), seed=0):
    """One state per (len, slots): histories with past amaxes, a live row holding normal, zero,
    NaN, inf and tiny amaxes, scales of 1 to 9, some slots recorded with a live amax of 0."""
    generator = torch.Generator().manual_seed(seed)
    made = []
    for length, n in zip(history_lens, slots):
        history = torch.rand(length, n, generator=generator) * 100
        history[0] = torch.tensor([3.0, 0.0, math.nan, math.inf, 1e-44, 448.0, -2.0][:n] + [1.0] * max(0, n - 7))
        scale = torch.arange(1, n + 1, dtype=torch.float32)
        recorded = torch.tensor([True, True, False, True, False, True, False][:n] + [True] * max(0, n - 7))
        made.append([t.to(device) for t in (history, scale, 1 / scale, recorded)])
    return made


def same(got, want) -> bool:
    """Equal values, NaN where NaN (the live rows hold one), dtype and shape too."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    return torch.equal(got, want) if got.dtype == torch.bool else torch.allclose(got, want, rtol=0, atol=0,
                                                                                 equal_nan=True)


def by_the_pure_functions(state, algo, fp8_max, margin):
    """One state's update as fp8/state.py made it before the op: scaling.py's functions."""
    history, scale, _, recorded = (t.clone() for t in state)
    takes_part = recorded | (history[0] != 0)
    rec = recipe.DelayedScaling(amax_history_len=history.shape[0], amax_compute_algo=algo, margin=margin)
    new_history, new_scale = scaling.update_delayed_scaling(history, scale, fp8_max, rec)
    new_scale = torch.where(takes_part, new_scale, scale)
    return [torch.where(takes_part, new_history, history), new_scale, torch.reciprocal(new_scale),
            torch.zeros_like(recorded)]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fp8_max, margin", [(448.0, 0), (57344.0, 2), (448.0, 0.5)])
def test_the_op_updates_each_state_as_the_pure_functions(backend, algo, fp8_max, margin):
    made = states(backend.device)
    want = [by_the_pure_functions(state, algo, fp8_max, margin) for state in made]
    ops.delayed_scaling_update_(*[[state[k] for state in made] for k in range(4)], algo, fp8_max, float(margin))
    for got_state, want_state in zip(made, want):
        for got, expected in zip(got_state, want_state):
            assert same(got.cpu(), expected.cpu()), (got, expected)


def test_the_op_refuses_bad_arguments():
    history, scale, scale_inv, recorded = states("cpu", (4,), (3,))[0]
    good = ([history], [scale], [scale_inv], [recorded])
    call = lambda *args: lambda: ops.delayed_scaling_update_(*args)  # noqa: E731
    assert_value_error_naming(call(*good, "mean", 448.0, 0.0), ["amax_compute_algo", "mean"])
    assert_value_error_naming(call(*good, "max", 448.0, -1.0), ["margin"])
    assert_value_error_naming(call([history], [scale, scale], [scale_inv], [recorded], "max", 448.0, 0.0), ["scales"])
    assert_value_error_naming(call([history], [scale[:2]], [scale_inv], [recorded], "max", 448.0, 0.0),
                              ["scales[0]", "[3]"])
    assert_value_error_naming(call([history], [scale], [scale_inv], [recorded.float()], "max", 448.0, 0.0),
                              ["recorded[0]"])
    assert_value_error_naming(call([history.new_zeros(3, 4).t()], [scale], [scale_inv], [recorded], "max", 448.0, 0.0),
                              ["amax_histories[0]", "contiguous"])


def _stack(rec, count=6, n=64):
    with te.quantized_model_init(recipe=rec):
        return [te.Linear(n, n, params_dtype=torch.bfloat16) for _ in range(count)]


def _twins(rec, count=6):
    """Two stacks of `count` modules with the same weights and FP8 states."""
    first, second = _stack(rec, count), _stack(rec, count)
    for a, b in zip(first, second):
        b.load_state_dict(a.state_dict())
    return first, second


def _states(modules, direction=FORWARD):
    return [[getattr(m.fp8_meta[direction], name).clone() for name in ("amax_history", "scale", "scale_inv")]
            for m in modules]


@pytest.mark.parametrize("rec", [
    recipe.DelayedScaling(amax_history_len=16),
    recipe.DelayedScaling(amax_history_len=1, margin=1, amax_compute_algo="most_recent"),
    recipe.DelayedScaling(amax_history_len=8, amax_compute_algo=lambda h: h.sum(dim=0),
                          scaling_factor_compute_algo=lambda amax, scale, fp8_max, r: fp8_max / amax / 8),
], ids=["max", "most_recent", "callables"])
def test_an_autocast_exit_updates_every_module_as_each_alone(rec):
    """Six modules updated together when the region exits hold the states that one update per
    module (fp8_meta.update, the per-module path) gives, step after step; decoding under
    no_grad, whose GEMMs skip the autograd function, records and updates as training does."""
    torch.manual_seed(0)
    together, alone = _twins(rec)
    for step in range(4):
        x = torch.randn(3, 64, dtype=torch.bfloat16) * (step + 1)
        with torch.no_grad():
            with te.autocast(recipe=rec):
                for m in together:
                    m(x)
            with te.autocast(recipe=rec):
                for m in alone:
                    m(x)
                    m.fp8_meta.update(FORWARD)  # before the exit's update: that one then finds nothing recorded
        for got, want in zip(_states(together), _states(alone)):
            for g, w in zip(got, want):
                assert torch.equal(g, w)


def test_decoding_casts_in_one_op_as_the_steps_do(monkeypatch):
    """A forward with no backward casts each input with fp8_quantize_delayed_ (the cast and its
    record in one op): outputs and FP8 states step after step as Float8Quantizer's separate steps
    (cast, then record) give them."""
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer
    from transformer_engine.pytorch.tensor.for_recipe import DelayedSlotQuantizer
    rec = recipe.DelayedScaling(amax_history_len=4)
    torch.manual_seed(0)
    fused, steps = _twins(rec, 3)
    for step in range(3):
        x = torch.randn(1, 64, dtype=torch.bfloat16) * (step + 1)
        with torch.no_grad():
            with te.autocast(recipe=rec):
                y_fused = torch.stack([m(x) for m in fused])
            with monkeypatch.context() as patch:
                patch.setattr(DelayedSlotQuantizer, "operand_of", Float8Quantizer.operand_of)
                with te.autocast(recipe=rec):
                    y_steps = torch.stack([m(x) for m in steps])
        assert torch.equal(y_fused, y_steps)
        for got, want in zip(_states(fused), _states(steps)):
            for g, w in zip(got, want):
                assert torch.equal(g, w)


def test_modules_of_different_recipes_and_lengths_update_apart():
    """States whose recipes differ in value, or whose histories differ in length, are not joined."""
    first, second = recipe.DelayedScaling(amax_history_len=4), recipe.DelayedScaling(amax_history_len=2, margin=3)
    modules = _stack(first, 2) + _stack(second, 2)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for m, rec in zip(modules, (first, first, second, second)):
            with te.autocast(recipe=rec):
                m(x)
    inputs = [m.fp8_meta[FORWARD].scale[0] for m in modules]  # the input slot: the same x, the same amax
    assert inputs[0] == inputs[1] == inputs[2] * 8 == inputs[3] * 8  # a margin of 3 apart
    assert [m.fp8_meta[FORWARD].amax_history.shape[0] for m in modules] == [4, 4, 2, 2]


def test_the_backward_update_is_the_ops_too():
    rec = recipe.DelayedScaling(amax_history_len=4)
    with te.autocast(recipe=rec):
        model = te.Linear(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    with te.autocast(recipe=rec):
        model(x).sum().backward()
    history = model.fp8_meta[BACKWARD].amax_history
    assert history[0].eq(0).all() and history[-1, 0] > 0  # rolled: the gradient's amax moved to the last row
    update_together([model.fp8_meta], BACKWARD, None)  # nothing recorded since: nothing changes
    assert torch.equal(model.fp8_meta[BACKWARD].amax_history, history)


CASES = OpCases("delayed_scaling")


@CASES.case("delayed_scaling_update_", compile=False)
def _(d):
    made = states(d)
    return tuple([state[k] for state in made] for k in range(4)) + ("max", 448.0, 0.0), ()


@CASES.case("delayed_scaling_update_[most_recent, margin]", compile=False)
def _(d):
    made = states(d, (2,), (7,), seed=1)
    return tuple([state[k] for state in made] for k in range(4)) + ("most_recent", 57344.0, 1.0), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
assert reference.delayed_scaling_update_  # the reference the cases are checked against
