"""parameters_split in TE's layout (module/_joined_rows.py): the parts of te.Linear's and
te.LayerNormLinear's weight and bias are views of one tensor, which a forward reads without
concatenating them (FP8 parts stay tensors of their own); gradients
reach each part as with torch.cat; optimizer steps and load_state_dict write through the views;
parts that are no longer views (replaced, moved) are concatenated again, with the same results."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8.quantized_tensor import QuantizedTensor

SPLIT = {"query": 32, "key": 16, "value": 16}
NAMES = [f"{name}_weight" for name in SPLIT]


def make(kind="Linear", **kwargs):
    torch.manual_seed(0)
    if kind == "Linear":
        return te.Linear(24, 64, parameters_split=SPLIT, **kwargs)
    return te.LayerNormLinear(24, 64, parameters_split=SPLIT, **kwargs)


def step(module, x, fp8_recipe=None):
    """(output, {parameter: gradient}) of one forward and backward."""
    module.zero_grad(set_to_none=True)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        y = module(x)
    y.backward(torch.linspace(-1, 1, y.numel()).view_as(y))
    return y.detach(), {name: p.grad.clone() for name, p in module.named_parameters()}


def unjoined(module):
    """The same module with every split parameter replaced by a copy: no longer views."""
    for name, param in list(module.named_parameters()):
        if name.startswith(("query", "key", "value")):
            setattr(module, name, torch.nn.Parameter(param.detach().clone()))
    return module


@pytest.mark.parametrize("kind", ["Linear", "LayerNormLinear"])
def test_parts_are_views_read_without_a_copy(kind):
    module = make(kind)
    weight, bias = module.weight_and_bias()
    assert weight.data_ptr() == module.query_weight.data_ptr() and bias.data_ptr() == module.query_bias.data_ptr()
    assert module.key_weight.data_ptr() == module.query_weight.data_ptr() + 32 * 24 * module.query_weight.element_size()
    assert torch.equal(weight, torch.cat([getattr(module, name) for name in NAMES]))


@pytest.mark.parametrize("kind", ["Linear", "LayerNormLinear"])
def test_gradients_and_outputs_equal_the_concatenated_parts(kind):
    x = torch.randn(5, 24, requires_grad=False)
    got = step(make(kind), x)
    want = step(unjoined(make(kind)), x)
    assert torch.equal(got[0], want[0])
    assert got[1].keys() == want[1].keys()
    for name in got[1]:
        assert torch.equal(got[1][name], want[1][name]), name
    assert make(kind).weight_and_bias()[0].data_ptr() != unjoined(make(kind)).weight_and_bias()[0].data_ptr()


def test_writes_through_the_views_reach_the_forward():
    module = make()
    x = torch.randn(3, 24)
    step(module, x)
    torch.optim.SGD(module.parameters(), lr=0.5).step()
    state = {name: t.clone() for name, t in module.state_dict().items()}
    fresh = make()
    fresh.load_state_dict(state)
    weight, bias = fresh.weight_and_bias()
    assert weight.data_ptr() == fresh.query_weight.data_ptr()
    assert torch.equal(weight, torch.cat([state[name] for name in NAMES]))
    assert torch.equal(fresh(x), module(x))


def test_moved_or_replaced_parts_are_concatenated_again():
    module = make()
    module.to(torch.float64)  # the parameters' data are replaced: no longer views
    weight, _ = module.weight_and_bias()
    assert weight.dtype == torch.float64 and torch.equal(weight, torch.cat([getattr(module, n) for n in NAMES]))
    assert weight.data_ptr() != module.query_weight.data_ptr()


def test_fp8_parts_stay_tensors_of_their_own():
    """quantized_model_init: each part its own FP8 weight, as before (a write into a view of one
    quantized tensor would round the other parts again); DelayedScaling's parts, cast with the
    module's one scale, are joined by concatenating their codes, never dequantised."""
    with te.quantized_model_init(recipe=recipe.DelayedScaling()):
        module = te.Linear(256, 384, parameters_split={"query": 128, "key": 128, "value": 128})
    assert module._joined_weight is None and all(isinstance(getattr(module, n), QuantizedTensor) for n in NAMES)
    weight, _ = module.weight_and_bias()
    assert isinstance(weight, QuantizedTensor)
    assert torch.equal(weight.dequantize(), torch.cat([getattr(module, n).dequantize() for n in NAMES]))


@pytest.mark.parametrize("fp8_recipe", [recipe.DelayedScaling(), recipe.Float8CurrentScaling(),
                                        recipe.Float8BlockScaling(), recipe.NVFP4BlockScaling()],
                         ids=["delayed", "current", "block", "nvfp4"])
def test_fp8_join_is_kept_while_the_parts_are_unchanged(fp8_recipe):
    """With no backward to record (decoding), the FP8 parts' join (cast once where their scales
    differ) is kept from call to call until a part is written; its outputs are those of a forward
    that joins the parts afresh (with a backward to record). DelayedScaling's update between the
    two forwards would move the second's, so there the joins are compared."""
    with te.quantized_model_init(recipe=fp8_recipe):
        module = te.Linear(256, 384, parameters_split={"query": 128, "key": 128, "value": 128})
    x = torch.randn(16, 256)
    with torch.no_grad():
        first, _ = module.weight_and_bias()
        assert module.weight_and_bias()[0] is first and isinstance(first, QuantizedTensor)
        with te.autocast(recipe=fp8_recipe):
            kept = module(x)
    fresh_join, _ = module.weight_and_bias()  # a backward to record: joined again
    assert fresh_join is not first
    if fp8_recipe.delayed():  # the codes concatenated, both times
        assert torch.equal(fresh_join.detach().dequantize(), first.dequantize())
    else:  # the values concatenated, cast by the forward as the kept join was cast once
        with te.autocast(recipe=fp8_recipe):
            fresh = module(x)
        assert torch.equal(kept, fresh.detach())
    with torch.no_grad():
        module.key_weight.add_(0.5)  # a write: the part holds a new operand
        second, _ = module.weight_and_bias()
    assert second is not first and not torch.equal(second.dequantize(), first.dequantize())
