"""torch.autocast (PyTorch's mixed precision, as Hugging Face's Trainer uses it with bf16=True):
our modules compute in the autocast dtype and return it, keep fp32 parameter gradients, equal
the same module fed the autocast dtype directly, and run their GEMMs in the dtype chosen by
custom_ops/linear.py rather than the one autocast would impose."""
import pytest
import torch

import transformer_engine.pytorch as te
from numerics import assert_close
from transformer_engine.common import recipe
from transformer_engine.pytorch.custom_ops.linear import linear

AMP = torch.bfloat16


def modules():
    """name -> (module with fp32 parameters, input [tokens or s, b, hidden], extra forward args)."""
    torch.manual_seed(0)
    return {
        "Linear": (te.Linear(48, 32), torch.randn(6, 48), ()),
        "LayerNorm": (te.LayerNorm(48), torch.randn(6, 48), ()),
        "RMSNorm": (te.RMSNorm(48), torch.randn(6, 48), ()),
        "LayerNormLinear": (te.LayerNormLinear(48, 32), torch.randn(6, 48), ()),
        "LayerNormMLP": (te.LayerNormMLP(48, 64), torch.randn(6, 48), ()),
        "GroupedLinear": (te.GroupedLinear(2, 48, 32), torch.randn(6, 48), ([2, 4],)),
        "TransformerLayer": (te.TransformerLayer(48, 64, 4, hidden_dropout=0.0, attention_dropout=0.0),
                             torch.randn(5, 2, 48), ()),
    }


def first(output):
    return output[0] if isinstance(output, tuple) else output


@pytest.mark.parametrize("name", list(modules()))
def test_module_computes_in_the_autocast_dtype(name):
    module, x, extra = modules()[name]
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=AMP):
        y = first(module(x, *extra))
    assert y.dtype == AMP
    y.float().square().sum().backward()
    assert x.grad.dtype == torch.float32
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values()), name

    # The same as feeding the autocast dtype outside autocast: parameters follow the input.
    module.zero_grad()
    x_amp = x.detach().to(AMP).requires_grad_(True)
    y_direct = first(module(x_amp, *extra))
    assert torch.equal(y, y_direct), name
    y_direct.float().square().sum().backward()
    for n, p in module.named_parameters():
        assert torch.equal(p.grad, grads[n]), f"{name}.{n}"


def test_linear_matches_torch_linear_under_autocast():
    torch.manual_seed(1)
    plain = torch.nn.Linear(64, 40)
    ours = te.Linear(64, 40)
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(9, 64)
    with torch.autocast("cpu", dtype=AMP):
        expected, actual = plain(x), ours(x)
    assert actual.dtype == expected.dtype == AMP
    assert_close(actual, expected, name="Linear under torch.autocast")


def test_gemm_dtype_is_not_overridden_by_autocast():
    """linear() widens bf16 operands (or keeps fp32 ones): autocast must not cast them back."""
    a, b = torch.randn(8, 16), torch.randn(4, 16)
    with torch.autocast("cpu", dtype=AMP):
        inside = linear(a, b)
    assert inside.dtype == torch.float32
    assert torch.equal(inside, torch.nn.functional.linear(a, b))


def test_fp8_autocast_inside_torch_autocast():
    torch.manual_seed(2)
    module = te.Linear(32, 32)
    x = torch.randn(16, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=AMP), te.autocast(recipe=recipe.DelayedScaling()):
        y = module(x)
    assert y.dtype == AMP
    y.float().sum().backward()
    assert module.weight.grad.dtype == torch.float32 and torch.isfinite(module.weight.grad).all()
    with torch.autocast("cpu", dtype=AMP):
        high = module(x)
    assert_close(y, high, dtype=torch.float8_e4m3fn, name="FP8 under torch.autocast")


def test_compile_fullgraph_under_autocast():
    module = te.LayerNormLinear(32, 16)
    x = torch.randn(4, 32)
    compiled = torch.compile(module, fullgraph=True)
    with torch.autocast("cpu", dtype=AMP):
        expected, actual = module(x), compiled(x)
    assert actual.dtype == AMP
    # Inductor keeps the fp32 weight where eager rounds it to bf16 first (it does not emulate
    # intermediate precision casts), so the two differ by a few bf16 ulps of the output's scale.
    assert_close(actual, expected, name="compiled under torch.autocast", atol=4 * 2**-8 * expected.abs().max().item())


def test_compile_fullgraph_bf16_linear():
    """The CPU GEMM policy query is read at import: compiled bf16 Linear traces without it."""
    module = te.Linear(32, 16, params_dtype=torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    assert torch.equal(torch.compile(module, fullgraph=True)(x), module(x))


def test_disabled_autocast_region_keeps_the_input_dtype():
    module = te.Linear(16, 8)
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=AMP), torch.autocast("cpu", enabled=False):
        assert module(x).dtype == torch.float32
