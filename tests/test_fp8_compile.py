"""FP8 modules under torch.compile: with the block recipes (no per-module state) every module
traces into one graph (fullgraph=True) and matches eager bit for bit over several steps, forward
and backward; with the per-tensor recipes (DelayedScaling, Float8CurrentScaling), whose backward
updates the module's amax history and scales, each FP8 GEMM runs between graphs: fullgraph=True
names the function that explains why, and with graph breaks allowed the outputs, gradients and scales equal eager's.

Most cases compile with the aot_eager backend: it runs the same Dynamo capture and AOTAutograd
forward/backward partition as inductor (where the per-tensor backward fails), in a fraction of the
time; one case compiles with inductor."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

BLOCK_RECIPES = [recipe.Float8BlockScaling(), recipe.MXFP8BlockScaling()]
PER_TENSOR_RECIPES = [recipe.DelayedScaling(amax_history_len=4, margin=1), recipe.Float8CurrentScaling()]


def _linear():
    return te.Linear(64, 32), lambda m, x: m(x)


def _layernorm_linear():
    return te.LayerNormLinear(64, 32, normalization="RMSNorm"), lambda m, x: m(x)


def _layernorm_mlp():
    return te.LayerNormMLP(64, 96, activation="swiglu"), lambda m, x: m(x)


def _grouped_linear():
    return te.GroupedLinear(3, 64, 32), lambda m, x: m(x, [5, 0, 11])


def _transformer_layer():
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0)
    return layer, lambda m, x: m(x.reshape(8, 2, 64))  # [tokens, hidden] -> [s, b, hidden]


MODULES = [_linear, _layernorm_linear, _layernorm_mlp, _grouped_linear, _transformer_layer]


def _eager_and_compiled(make, **compile_args):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager, call = make()
    other, _ = make()
    other.load_state_dict(eager.state_dict())
    return eager, other, torch.compile(other, **compile_args), call


def _steps_match(eager, module, compiled, call, rec, steps=3):
    """Runs both for `steps` FP8 training steps (inputs growing, so the scales move) and checks
    outputs, every parameter gradient and both directions' scales are equal after each."""
    for step in range(steps):
        x = torch.randn(16, 64) * (step + 1)
        with te.autocast(recipe=rec):
            y_eager, y_compiled = call(eager, x), call(compiled, x)
        (y_eager * y_eager).sum().backward()
        (y_compiled * y_compiled).sum().backward()
        assert torch.equal(y_eager, y_compiled), f"step {step}: outputs differ"
        for (name, p), q in zip(eager.named_parameters(), module.parameters()):
            assert torch.equal(p.grad, q.grad), f"step {step}: gradient of {name} differs"
        for m_eager, m_compiled in zip(eager.modules(), module.modules()):
            meta = getattr(m_eager, "fp8_meta", None)
            if meta is not None:
                for direction in ("scaling_fwd", "scaling_bwd"):
                    assert torch.equal(meta[direction].scale, m_compiled.fp8_meta[direction].scale), \
                        f"step {step}: {type(m_eager).__name__} {direction} scales differ"


@pytest.mark.parametrize("rec", BLOCK_RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("make", MODULES, ids=lambda f: f.__name__.strip("_"))
def test_block_recipes_compile_into_one_graph(make, rec):
    eager, module, compiled, call = _eager_and_compiled(make, fullgraph=True, backend="aot_eager")
    _steps_match(eager, module, compiled, call, rec)


def test_block_recipe_compiles_with_inductor():
    eager, module, compiled, call = _eager_and_compiled(_layernorm_mlp, fullgraph=True)
    _steps_match(eager, module, compiled, call, recipe.MXFP8BlockScaling(), steps=2)


@pytest.mark.parametrize("rec", PER_TENSOR_RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("make", [_linear, _grouped_linear], ids=lambda f: f.__name__.strip("_"))
def test_per_tensor_recipes_name_their_graph_break_under_fullgraph(make, rec):
    _, _, compiled, call = _eager_and_compiled(make, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="fp8_gemm_of_a_per_tensor_recipe_runs_outside_the_graph"):
        with te.autocast(recipe=rec):
            call(compiled, torch.randn(16, 64))


@pytest.mark.parametrize("rec", PER_TENSOR_RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("make", [_layernorm_mlp, _grouped_linear, _transformer_layer],
                         ids=lambda f: f.__name__.strip("_"))
def test_per_tensor_recipes_match_eager_with_graph_breaks(make, rec):
    eager, module, compiled, call = _eager_and_compiled(make, backend="aot_eager")
    _steps_match(eager, module, compiled, call, rec)
