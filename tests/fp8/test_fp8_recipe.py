"""transformer_engine.common.recipe: TE's names, defaults and validation."""
import pytest
import torch

import transformer_engine.pytorch as te
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


def test_recipes_are_mutable_and_comparable():
    """TE's recipes are mutable dataclasses: fields are assigned after construction."""
    r = recipe.DelayedScaling(margin=2, amax_history_len=8)
    r.margin, r.amax_history_len = 3, 4
    assert r == recipe.DelayedScaling(margin=3, amax_history_len=4)
    block = recipe.Float8BlockScaling()
    block.backward_override = "dequantized"
    assert block.backward_override == "dequantized" and block != recipe.Float8BlockScaling()


@pytest.mark.parametrize("make, field, value", [
    (recipe.DelayedScaling, "amax_history_len", 0),
    (recipe.DelayedScaling, "amax_compute_algo", "mean"),
    (recipe.DelayedScaling, "fp8_format", recipe.Format.E5M2),
    (recipe.DelayedScaling, "backward_override", "high_precision"),
    (recipe.Float8CurrentScaling, "amax_epsilon", -1.0),
    (recipe.Float8BlockScaling, "w_block_scaling_dim", 3),
    (recipe.Float8BlockScaling, "backward_override", "fp32"),
    (recipe.MXFP8BlockScaling, "fp8_format", recipe.Format.E5M2),
    (recipe.NVFP4BlockScaling, "fp8_format", recipe.Format.HYBRID),
    (recipe.CustomRecipe, "qfactory", 3),
])
def test_assignment_is_validated_and_a_refused_value_changes_nothing(make, field, value):
    r = make()
    before = getattr(r, field)
    with pytest.raises(ValueError, match=field):
        setattr(r, field, value)
    assert getattr(r, field) == before and r == make()


def test_te_2x_fields_predicates_and_the_recipes_autocast_refuses():
    assert recipe.DelayedScaling.delayed() and recipe.MXFP8BlockScaling().mxfp8()
    assert recipe.NVFP4BlockScaling().nvfp4() and not recipe.DelayedScaling().nvfp4()
    assert recipe.CustomRecipe(qfactory=lambda role: None).custom() and not recipe.Float8BlockScaling.custom()
    assert not recipe.Float8BlockScaling().mxfp4_qat()
    current = recipe.Float8CurrentScaling(use_power_2_scales=True, amax_epsilon=1e-3)
    quant = recipe.QParams(power_2_scale=True, amax_epsilon=1e-3)
    assert current.fp8_quant_fwd_inp == quant == current.fp8_quant_bwd_grad
    assert not current.fp8_gemm_fprop.use_split_accumulator and recipe.Float8BlockScaling().fp8_gemm_wgrad == \
        recipe.MMParams(use_split_accumulator=True)
    assert recipe.MXFP8BlockScaling(margin=1).margin == 1
    nvfp4 = recipe.NVFP4BlockScaling(disable_rht=True)
    assert not nvfp4.fp4_quant_fwd_inp.random_hadamard_transform and nvfp4.fp4_quant_bwd_grad.stochastic_rounding
    with pytest.raises(ValueError, match="E2M1"):
        recipe.Format.E2M1.dtype(backward=False)
    with te.autocast(recipe=nvfp4):  # NVFP4 runs (tests/modules/test_nvfp4_modules.py)
        assert te.fp8.current_context().recipe.nvfp4()


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
