"""The modules' forwards read their parameters from _parameters (utils.forward_param, cheaper than
Module.__getattr__): whatever else provides a parameter still reaches the forward. Checked for
torch.func.functional_call, a parametrization (torch.nn.utils.parametrize) and a pre-forward hook
that replaces the parameter by a plain attribute (torch.nn.utils.weight_norm), each against the
same module holding the resulting tensors as its own parameters."""
import warnings

import pytest
import torch
from torch.nn.utils import parametrize

import transformer_engine.pytorch as te

HIDDEN, OUT = 24, 40
MODULES = {
    "LayerNorm": lambda: te.LayerNorm(HIDDEN),
    "RMSNorm": lambda: te.RMSNorm(HIDDEN),
    "Linear": lambda: te.Linear(HIDDEN, OUT),
    "LayerNormLinear": lambda: te.LayerNormLinear(HIDDEN, OUT),
}


def _input() -> torch.Tensor:
    return torch.randn(3, 5, HIDDEN, generator=torch.Generator().manual_seed(1))


def _with_values(make, values: dict) -> torch.nn.Module:
    """A fresh module whose own parameters are set to `values` (name -> tensor)."""
    module = make()
    with torch.no_grad():
        for name, value in values.items():
            getattr(module, name).copy_(value)
    return module


@pytest.mark.parametrize("name", MODULES)
def test_functional_call_uses_the_given_parameters(name):
    module = MODULES[name]()
    replaced = {n: torch.randn_like(p) for n, p in module.named_parameters()}
    x = _input()
    got = torch.func.functional_call(module, replaced, (x,))
    torch.testing.assert_close(got, _with_values(MODULES[name], replaced)(x), rtol=0, atol=0)
    # and the module's own parameters are back afterwards
    assert not torch.equal(module(x), got)


class _Doubled(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 2 * weight


@pytest.mark.parametrize("name", MODULES)
def test_a_parametrized_weight_is_the_one_used(name):
    module = MODULES[name]()
    with torch.no_grad():
        module.weight.normal_()
    original = module.weight.detach().clone()
    parametrize.register_parametrization(module, "weight", _Doubled())
    x = _input()
    y = module(x)
    torch.testing.assert_close(y, _with_values(MODULES[name], {"weight": 2 * original})(x), rtol=0, atol=0)
    y.sum().backward()
    grad = module.parametrizations.weight.original.grad
    assert grad is not None and grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear"])
def test_weight_norm_hook_attribute_is_the_one_used(name):
    module = MODULES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # weight_norm is deprecated in torch
        torch.nn.utils.weight_norm(module, name="weight", dim=0)
    assert "weight" not in module._parameters
    x = _input()
    y = module(x)
    weight = torch._weight_norm(module.weight_v, module.weight_g, 0).detach()
    torch.testing.assert_close(y, _with_values(MODULES[name], {"weight": weight})(x))
    y.sum().backward()
    assert module.weight_g.grad is not None and module.weight_v.grad is not None
