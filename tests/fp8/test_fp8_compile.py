"""FP8 modules under torch.compile, checked against eager bit for bit over several steps
(outputs, every parameter gradient, both directions' scales and amax histories).

Block recipes keep no per-module state: every module traces into one graph (fullgraph=True) from
its first call. The per-tensor recipes (DelayedScaling, Float8CurrentScaling) update fp8_meta in
the backward, which AOTAutograd can compile only when fp8_meta already exists when the graph is
traced: a module's first compiled FP8 forward therefore makes it between two graphs, and
fullgraph=True works from the next call on (or after any eager FP8 step).

Most cases compile with the aot_eager backend: it runs the same Dynamo capture and AOTAutograd
forward/backward partition as inductor (where the failures this guards against arise) in a
fraction of the time; two cases compile with inductor."""
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
    outputs, every parameter gradient and both directions' scales and amax histories are equal
    after each."""
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
                    for name in ("scale", "amax_history"):
                        assert torch.equal(getattr(meta[direction], name),
                                           getattr(m_compiled.fp8_meta[direction], name)), \
                            f"step {step}: {type(m_eager).__name__} {direction} {name} differs"


@pytest.mark.parametrize("rec", BLOCK_RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("make", MODULES, ids=lambda f: f.__name__.strip("_"))
def test_block_recipes_compile_into_one_graph(make, rec):
    eager, module, compiled, call = _eager_and_compiled(make, fullgraph=True, backend="aot_eager")
    _steps_match(eager, module, compiled, call, rec)


def test_block_recipe_compiles_with_inductor():
    eager, module, compiled, call = _eager_and_compiled(_layernorm_mlp, fullgraph=True)
    _steps_match(eager, module, compiled, call, recipe.MXFP8BlockScaling(), steps=2)


def _one_eager_fp8_step(modules, call, rec):
    for module in modules:
        with te.autocast(recipe=rec):
            y = call(module, torch.ones(16, 64))
        y.sum().backward()


@pytest.mark.parametrize("rec", PER_TENSOR_RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("make", MODULES, ids=lambda f: f.__name__.strip("_"))
def test_per_tensor_recipes_compile_into_one_graph_once_fp8_meta_exists(make, rec):
    eager, module, compiled, call = _eager_and_compiled(make, fullgraph=True, backend="aot_eager")
    _one_eager_fp8_step((eager, module), call, rec)
    _steps_match(eager, module, compiled, call, rec)


def test_per_tensor_recipe_compiles_with_inductor():
    eager, module, compiled, call = _eager_and_compiled(_transformer_layer, fullgraph=True)
    rec = PER_TENSOR_RECIPES[0]
    _one_eager_fp8_step((eager, module), call, rec)
    _steps_match(eager, module, compiled, call, rec, steps=2)


@pytest.mark.parametrize("rec", PER_TENSOR_RECIPES, ids=lambda r: type(r).__name__)
def test_first_fullgraph_call_of_a_per_tensor_recipe_names_why_it_breaks(rec):
    _, _, compiled, call = _eager_and_compiled(_linear, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="per_tensor_fp8_meta_is_created_outside_the_graph"):
        with te.autocast(recipe=rec):
            call(compiled, torch.randn(16, 64))


@pytest.mark.parametrize("rec", PER_TENSOR_RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("make", [_layernorm_mlp, _grouped_linear, _transformer_layer],
                         ids=lambda f: f.__name__.strip("_"))
def test_per_tensor_recipes_match_eager_from_the_first_compiled_call(make, rec):
    eager, module, compiled, call = _eager_and_compiled(make, backend="aot_eager")
    _steps_match(eager, module, compiled, call, rec)
