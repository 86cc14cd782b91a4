"""CustomRecipe: modules cast each GEMM operand with the quantizer a user factory made for its
slot (TransformerEngine's roles), made once per recipe and kept across steps. The factories of
custom_recipes.quantization_recipes_base reproduce the built-in recipes bit for bit; answers
this package cannot run are refused by name."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.custom_recipes import quantization_recipes_base as factories
from transformer_engine.pytorch.quantization import DelayedScalingRequest, QuantizerRole

BUILT_IN = [(recipe.DelayedScaling(), factories.delayed_scaling_quantizer_factory),
            (recipe.Float8CurrentScaling(), factories.current_scaling_quantizer_factory),
            (recipe.MXFP8BlockScaling(), factories.mxfp8_quantizer_factory),
            (recipe.Float8BlockScaling(), factories.float8_block_scaling_quantizer_factory)]
MODULES = {
    "linear": lambda: te.Linear(64, 64, params_dtype=torch.bfloat16),
    "layernorm_linear": lambda: te.LayerNormLinear(64, 64, params_dtype=torch.bfloat16),
    "layernorm_mlp": lambda: te.LayerNormMLP(64, 96, params_dtype=torch.bfloat16),
    "grouped_linear": lambda: te.GroupedLinear(3, 64, 64, params_dtype=torch.bfloat16),
    "ops_sequential": lambda: te.ops.Sequential(te.ops.RMSNorm(64, dtype=torch.bfloat16),
                                                te.ops.Linear(64, 64, dtype=torch.bfloat16)),
}


def call(module, x):
    return module(x, [16, 0, 32]) if isinstance(module, te.GroupedLinear) else module(x)


def run_steps(module, rec, steps=3):
    """Forward and backward of growing inputs (so that delayed scales move), returning the
    last output, input gradient and parameter gradients."""
    for step in range(steps):
        x = (torch.randn(48, 64, generator=torch.Generator().manual_seed(step)) * (1 + 2 * step))
        x = x.to(torch.bfloat16).requires_grad_()
        with te.autocast(recipe=rec):
            y = call(module, x)
        (y.float() * torch.linspace(-3, 3, 64)).sum().backward()
    return y, x.grad, [p.grad.clone() for p in module.parameters()]


def current_scaling(role):
    gradient = role is not None and role.tensor_type == "grad_output"
    return te.Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2 if gradient else te.DType.kFloat8E4M3)


@pytest.mark.parametrize("module", MODULES, ids=str)
@pytest.mark.parametrize("built_in, factory", BUILT_IN, ids=lambda v: type(v).__name__ if isinstance(v, recipe.Recipe)
                         else "")
def test_base_factories_match_the_built_in_recipes_bit_for_bit(module, built_in, factory):
    torch.manual_seed(0)
    reference = MODULES[module]()
    custom = MODULES[module]()
    custom.load_state_dict(reference.state_dict())
    want = run_steps(reference, built_in)
    got = run_steps(custom, recipe.CustomRecipe(qfactory=factory))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for grad_got, grad_want in zip(got[2], want[2]):
        assert torch.equal(grad_got, grad_want)


def test_the_factory_is_asked_once_per_slot_with_te_roles():
    asked = []

    def factory(role):
        asked.append(role)
        return current_scaling(role)

    layer = te.Linear(32, 32, name="proj")
    rec = recipe.CustomRecipe(qfactory=factory)
    for _ in range(3):
        with te.autocast(recipe=rec):
            layer(torch.randn(8, 32, requires_grad=True)).sum().backward()
    assert asked == [QuantizerRole("linear", "input", "proj"), QuantizerRole("linear", "weight", "proj"), None,
                     QuantizerRole("linear", "grad_output", "proj"), None]
    with te.autocast(recipe=recipe.CustomRecipe(qfactory=factory)):  # another recipe object: asked again
        layer(torch.randn(8, 32))
    assert len(asked) == 10


def test_layernorm_mlp_and_grouped_linear_roles():
    asked = []

    def factory(role):
        asked.append(role)
        return current_scaling(role)

    rec = recipe.CustomRecipe(qfactory=factory)
    with te.autocast(recipe=rec):
        te.LayerNormMLP(32, 48, name="mlp")(torch.randn(8, 32))
    fc1, fc2 = (lambda kind: QuantizerRole("linear", kind, "mlp.fc1")), (lambda kind: QuantizerRole("linear", kind,
                                                                                                      "mlp.fc2"))
    # A tensor between the GEMMs is named after the GEMM consuming it (TE's convention).
    assert asked == [fc1("input"), fc1("weight"), fc2("input"), fc2("input"), fc2("weight"), None,
                     fc1("grad_output"), None, fc2("grad_output"), fc1("grad_output")]
    asked.clear()
    with te.autocast(recipe=rec):
        te.GroupedLinear(2, 32, 32)(torch.randn(8, 32), [3, 5])
    kinds = [role.tensor_type if role else None for role in asked]
    assert kinds == ["input", "input", "weight", "weight", None, None, "grad_output", "grad_output", None, None]
    assert {role.module_type for role in asked if role} == {"grouped_linear"}


def test_module_quantizers_are_the_factorys():
    layer = te.Linear(32, 32)
    with te.autocast(recipe=recipe.CustomRecipe(qfactory=current_scaling)):
        layer(torch.randn(8, 32))
    forward, backward = layer.quantizers["scaling_fwd"], layer.quantizers["scaling_bwd"]
    assert [q.dtype for q in forward] == [te.DType.kFloat8E4M3] * 3
    assert [q.dtype for q in backward] == [te.DType.kFloat8E5M2, te.DType.kFloat8E4M3]  # grad_input: role None


def test_a_stateful_quantizer_keeps_its_state_across_steps():
    """A Float8Quantizer from the factory casts with the scale it was given and keeps the
    running maximum of what it casts in its own amax, step after step."""
    scale, amax = torch.tensor([4.0]), torch.zeros(1)
    weight_quantizer = te.Float8Quantizer(scale, amax, te.DType.kFloat8E4M3)

    def factory(role):
        return weight_quantizer if role is not None and role.tensor_type == "weight" else current_scaling(role)

    layer = te.Linear(32, 16, bias=False)
    rec = recipe.CustomRecipe(qfactory=factory)
    inputs = [torch.randn(8, 32) for _ in range(2)]
    with torch.no_grad():
        layer.weight.mul_(0.5)
        for x in inputs:
            with te.autocast(recipe=rec):
                y = layer(x)
    limit = torch.finfo(torch.float8_e4m3fn).max
    w_q = (layer.weight.float() * 4.0).clamp(-limit, limit).to(torch.float8_e4m3fn).float() / 4.0
    x = inputs[-1]
    x_scale = limit / x.abs().max()
    x_q = (x * x_scale).to(torch.float8_e4m3fn).float() / x_scale
    torch.testing.assert_close(y, x_q @ w_q.t(), rtol=1e-6, atol=1e-6)
    assert amax.item() == layer.weight.abs().max().item()


def test_delayed_scaling_requests_mixed_with_current_scaling():
    """Only the weights ask for delayed scaling: their slots' scales move with the module's
    update (the request's parameters), the other slots keep theirs."""
    def factory(role):
        if role is not None and role.tensor_type == "weight":
            return DelayedScalingRequest(amax_history_len=4, margin=1)
        return current_scaling(role)

    layer = te.Linear(32, 32)
    rec = recipe.CustomRecipe(qfactory=factory)
    for _ in range(2):
        with te.autocast(recipe=rec):
            layer(torch.randn(8, 32, requires_grad=True)).sum().backward()
    state = layer.fp8_meta["scaling_fwd"]
    assert state.amax_history.shape == (4, 3)
    amax = layer.weight.detach().abs().max()
    torch.testing.assert_close(state.scale[1], 448.0 / amax / 2)  # margin 1
    assert state.scale[0].item() == 1.0 and state.scale[2].item() == 1.0


@pytest.mark.parametrize("answer, error, words", [
    (lambda role: object(), NotImplementedError, "qfactory.*returned object"),
    (lambda role: DelayedScalingRequest(margin=0 if role is None else 1), ValueError, "must be equal"),
])
def test_answers_this_package_cannot_run_are_refused(answer, error, words):
    with pytest.raises(error, match=words), te.autocast(recipe=recipe.CustomRecipe(qfactory=answer)):
        te.Linear(16, 16)(torch.randn(4, 16))


def test_a_custom_recipe_without_a_factory_is_refused():
    with pytest.raises(ValueError, match="qfactory"), te.autocast(recipe=recipe.CustomRecipe()):
        pass


def test_the_nvfp4_factory_casts_as_the_recipe():
    """CustomRecipe(qfactory=nvfp4_quantizer_factory) gives NVFP4BlockScaling's outputs and
    gradients bit for bit (the same casts, stochastic rounding's draws in the same order)."""
    results = []
    for rec in (recipe.NVFP4BlockScaling(), recipe.CustomRecipe(qfactory=factories.nvfp4_quantizer_factory)):
        torch.manual_seed(11)
        layer = te.Linear(32, 16)
        x = torch.randn(16, 32, requires_grad=True)
        with te.autocast(recipe=rec):
            y = layer(x)
        y.square().sum().backward()
        results.append((y, x.grad, layer.weight.grad))
    for got, want in zip(*results):
        assert torch.equal(got, want)
