"""transformer_engine.common.recipe: TE's names, defaults and validation."""
import dataclasses

import pytest
import torch

from transformer_engine.common import recipe


def test_formats_and_their_limits():
    assert recipe.Format.E4M3.value.max_fwd == 448 and recipe.Format.E4M3.value.max_bwd == 448
    assert recipe.Format.E5M2.value.max_fwd == 57344
    assert recipe.Format.HYBRID.value == (448, 57344)
    assert recipe.Format.HYBRID.dtype(backward=False) == torch.float8_e4m3fn
    assert recipe.Format.HYBRID.dtype(backward=True) == torch.float8_e5m2
    assert recipe.Format.E4M3.dtype(backward=True) == torch.float8_e4m3fn
    assert torch.finfo(torch.float8_e4m3fn).max == recipe.Format.E4M3.value.max_fwd
    assert torch.finfo(torch.float8_e5m2).max == recipe.Format.E5M2.value.max_fwd


def test_delayed_scaling_defaults_match_transformer_engine():
    r = recipe.DelayedScaling()
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (0, recipe.Format.HYBRID, 1024, "max")
    assert r.scaling_factor_compute_algo is None and r.reduce_amax is True
    assert r.fp8_dpa is False and r.fp8_mha is False
    assert r.delayed() and r.float8_per_tensor_scaling() and not r.mxfp8()


def test_other_recipes_defaults():
    assert recipe.Float8CurrentScaling().fp8_format == recipe.Format.HYBRID
    assert recipe.Float8CurrentScaling().use_power_2_scales is False
    block = recipe.Float8BlockScaling()
    assert block.fp8_format == recipe.Format.E4M3 and block.use_power_2_scales
    assert (block.x_block_scaling_dim, block.w_block_scaling_dim, block.grad_block_scaling_dim) == (1, 2, 1)
    assert recipe.MXFP8BlockScaling().fp8_format == recipe.Format.E4M3
    assert recipe.MXFP8BlockScaling().mxfp8() and recipe.Float8BlockScaling().float8_block_scaling()
    assert recipe.Float8CurrentScaling().float8_current_scaling()


def test_recipes_are_frozen_and_comparable():
    r = recipe.DelayedScaling(margin=2, amax_history_len=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.margin = 3
    assert r == recipe.DelayedScaling(margin=2, amax_history_len=8)
    assert hash(r) == hash(recipe.DelayedScaling(margin=2, amax_history_len=8))


def test_callable_algorithms_are_accepted():
    r = recipe.DelayedScaling(amax_compute_algo=lambda h: h.max(dim=0).values,
                              scaling_factor_compute_algo=lambda amax, scale, fp8_max, rec: scale)
    assert callable(r.amax_compute_algo)


@pytest.mark.parametrize("make, field", [
    (lambda: recipe.DelayedScaling(fp8_format=recipe.Format.E5M2), "fp8_format"),
    (lambda: recipe.DelayedScaling(amax_history_len=0), "amax_history_len"),
    (lambda: recipe.DelayedScaling(amax_history_len=-4), "amax_history_len"),
    (lambda: recipe.DelayedScaling(amax_history_len=2.5), "amax_history_len"),
    (lambda: recipe.DelayedScaling(amax_compute_algo="mean"), "amax_compute_algo"),
    (lambda: recipe.DelayedScaling(margin=-1), "margin"),
    (lambda: recipe.DelayedScaling(scaling_factor_compute_algo="fast"), "scaling_factor_compute_algo"),
    (lambda: recipe.DelayedScaling(fp8_format="HYBRID"), "fp8_format"),
    (lambda: recipe.Float8CurrentScaling(fp8_format=recipe.Format.E5M2), "fp8_format"),
    (lambda: recipe.Float8CurrentScaling(amax_epsilon=-1.0), "amax_epsilon"),
    (lambda: recipe.Float8BlockScaling(fp8_format=recipe.Format.E5M2), "fp8_format"),
    (lambda: recipe.Float8BlockScaling(w_block_scaling_dim=3), "w_block_scaling_dim"),
    (lambda: recipe.MXFP8BlockScaling(fp8_format=recipe.Format.E5M2), "fp8_format"),
])
def test_bad_recipe_raises_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()
