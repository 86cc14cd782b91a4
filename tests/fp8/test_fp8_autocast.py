"""te.autocast / te.fp8_autocast regions: nesting, disabling, calibration, the deferred
forward update at the outermost exit, and argument checks."""
import pytest

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8 import context as regions


def test_outside_any_region_there_is_no_context():
    assert te.fp8.current_context() is None


def test_default_recipe_and_availability():
    assert te.get_default_recipe() == recipe.DelayedScaling()
    assert te.is_fp8_available() is True and te.is_fp8_available(return_reason=True) == (True, "")
    assert te.is_mxfp8_available() is True and te.is_fp8_block_scaling_available(True) == (True, "")
    assert te.is_nvfp4_available() is True and te.is_nvfp4_available(return_reason=True) == (True, "")
    assert te.is_bf16_available() is True
    with te.autocast():
        ctx = te.fp8.current_context()
        assert ctx.enabled and not ctx.calibrating and ctx.recipe == recipe.DelayedScaling()


def test_nesting_and_disabled_inner_region():
    outer, inner = recipe.DelayedScaling(margin=1), recipe.Float8CurrentScaling()
    with te.autocast(recipe=outer):
        assert te.fp8.current_context().recipe is outer
        with te.autocast(enabled=False):
            assert not te.fp8.current_context().enabled
            with te.autocast(recipe=inner):
                assert te.fp8.current_context().recipe is inner and te.fp8.current_context().enabled
            assert not te.fp8.current_context().enabled
        assert te.fp8.current_context().recipe is outer and te.fp8.current_context().enabled
    assert te.fp8.current_context() is None


def test_calibrating_records_amax_without_fp8_compute():
    with te.autocast(enabled=False, calibrating=True):
        ctx = te.fp8.current_context()
        assert not ctx.enabled and ctx.calibrating and ctx.records_amax


def test_contexts_are_immutable():
    with te.autocast():
        with pytest.raises(Exception):
            te.fp8.current_context().enabled = False


def test_forward_updates_run_once_when_the_outermost_region_exits():
    calls = []

    class State:
        def update_forward(self, group):
            calls.append(group)

    state, group = State(), object()
    with te.autocast(amax_reduction_group=group):
        with te.autocast():
            regions.defer_forward_update(state)
            regions.defer_forward_update(state)
        assert calls == []  # inner exit: nothing yet
    assert calls == [group]
    with te.autocast():
        pass
    assert calls == [group]


def test_region_is_popped_when_the_body_raises():
    with pytest.raises(RuntimeError):
        with te.autocast():
            raise RuntimeError("boom")
    assert te.fp8.current_context() is None


def test_old_spelling_maps_its_arguments_and_warns():
    r = recipe.DelayedScaling(amax_history_len=16)
    group = object()
    with pytest.warns(DeprecationWarning, match="fp8_autocast"):
        with te.fp8_autocast(enabled=True, calibrating=False, fp8_recipe=r, fp8_group=group):
            ctx = te.fp8.current_context()
            assert ctx.recipe is r and ctx.amax_reduction_group is group


def test_bad_recipe_is_rejected():
    with pytest.raises(ValueError, match="recipe"):
        with te.autocast(recipe="delayed"):
            pass
    assert te.fp8.current_context() is None
