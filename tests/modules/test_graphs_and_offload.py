"""te.make_graphed_callables and te.get_cpu_offload_context on the CPU: the callables compute
what they compute called directly (inside the autocast region their arguments describe), and
the offload context keeps results and gradients unchanged."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe


def _pair():
    torch.manual_seed(0)
    direct, graphed = te.LayerNormMLP(32, 64), te.LayerNormMLP(32, 64)
    graphed.load_state_dict(direct.state_dict())
    return direct, graphed


@pytest.mark.parametrize("fp8", [False, True])
def test_graphed_module_equals_the_module_in_its_region(fp8):
    direct, graphed = _pair()
    rec = recipe.DelayedScaling() if fp8 else None
    x = torch.randn(8, 32)
    same = te.make_graphed_callables(graphed, (x,), enabled=fp8, recipe=rec)
    assert same is graphed and isinstance(same, te.LayerNormMLP)  # the module, its forward wrapped
    for step in range(2):
        xd, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
        with te.autocast(enabled=fp8, recipe=rec):
            yd = direct(xd)
        yg = same(xg)  # outside any region: the graphed callable opens its own
        yd.sum().backward()
        yg.sum().backward()
        assert torch.equal(yd, yg) and torch.equal(xd.grad, xg.grad), step
    assert (graphed.fp8_meta is not None) == fp8
    if fp8:
        assert torch.equal(direct.fp8_meta["scaling_fwd"].scale, graphed.fp8_meta["scaling_fwd"].scale)


def test_tuple_of_callables_and_deprecated_names():
    first, second = te.Linear(8, 8), (lambda t: t * 2)
    x = torch.randn(2, 8)
    with pytest.warns(DeprecationWarning, match="fp8_enabled"):
        graphed = te.make_graphed_callables((first, second), ((x,), (x,)), fp8_enabled=(False, False))
    assert isinstance(graphed, tuple) and graphed[0] is first and torch.equal(graphed[1](x), x * 2)
    with pytest.raises(ValueError, match="fp8_recipe.*recipe"):
        te.make_graphed_callables(first, (x,), fp8_recipe=recipe.DelayedScaling(), recipe=recipe.DelayedScaling())
    with pytest.raises(ValueError, match="2 callables but 1"):
        te.make_graphed_callables((first, second), ((x,),))


@pytest.mark.parametrize("manual", [False, True])
def test_cpu_offload_context_keeps_results(manual):
    torch.manual_seed(0)
    layers = [te.Linear(16, 16) for _ in range(3)]
    x = torch.randn(4, 16, requires_grad=True)
    expected = x
    for layer in layers:
        expected = layer(expected)
    expected.sum().backward()
    expected_grads = [x.grad.clone()] + [layer.weight.grad.clone() for layer in layers]
    x.grad = None
    for layer in layers:
        layer.weight.grad = None
    returned = te.get_cpu_offload_context(enabled=True, num_layers=2, model_layers=3,
                                          manual_synchronization=manual)
    context, sync = returned[:2]
    assert len(returned) == (3 if manual else 2)
    y = x
    for i, layer in enumerate(layers):
        with context:
            y = layer(y)
        y = sync(y)
        if manual:
            returned[2].start_offload_layer(i)
    y.sum().backward()
    assert torch.equal(y, expected)
    assert all(torch.equal(a, b) for a, b in zip([x.grad] + [layer.weight.grad for layer in layers], expected_grads))
    assert context.entered == 3


def test_cpu_offload_refuses_bad_layer_counts():
    with pytest.raises(ValueError, match="num_layers=3.*model_layers=2"):
        te.get_cpu_offload_context(enabled=True, num_layers=3, model_layers=2)


def test_cpu_offload_hooks_only_the_first_num_layers(monkeypatch):
    from transformer_engine.pytorch import cpu_offload
    seen = []
    monkeypatch.setattr(cpu_offload, "_to_host", lambda t: (seen.append(layer_index), (t, None))[1])
    context, sync = te.get_cpu_offload_context(enabled=True, num_layers=1, model_layers=2)
    y = torch.randn(4, 8, requires_grad=True)
    for layer_index, layer in enumerate([te.Linear(8, 8), te.Linear(8, 8)] * 2):  # two passes over 2 layers
        with context:
            y = sync(layer(y))
    y.sum().backward()
    assert seen and set(seen) == {0, 2}  # the first layer of each model pass
