"""te.LayerNorm / te.RMSNorm against torch.nn.LayerNorm / torch.nn.RMSNorm with copied
parameters, TransformerEngine's arguments and parameter names, state_dict, meta device,
torch.compile and input errors."""
import pytest
import torch

import transformer_engine.pytorch as te
from numerics import assert_close

MODULES = {
    "LayerNorm": (te.LayerNorm, torch.nn.LayerNorm),
    "RMSNorm": (te.RMSNorm, torch.nn.RMSNorm),
}


def make_pair(name, hidden, params_dtype, eps=1e-5, device="cpu"):
    ours_cls, torch_cls = MODULES[name]
    ours = ours_cls(hidden, eps=eps, params_dtype=params_dtype, device=device)
    theirs = torch_cls(hidden, eps=eps, dtype=params_dtype, device=device)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(mean=1.0 if p is ours.weight else 0.0, std=0.2)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 64), (5, 77), (0, 16)], ids=str)
def test_matches_torch_module(device, name, dtype, shape):
    """torch's module runs in fp32 on the same (rounded) values: the exact answer to compare
    ours against with `dtype`'s tolerance."""
    ours, theirs = make_pair(name, shape[-1], dtype, device=device)
    theirs.float()
    x = torch.randn(shape, dtype=dtype, device=device)
    dy = torch.randn(shape, dtype=dtype, device=device)
    x1, x2 = x.clone().requires_grad_(), x.float().requires_grad_()
    y1, y2 = ours(x1), theirs(x2)
    y1.backward(dy), y2.backward(dy.float())
    assert_close(y1, y2, dtype=dtype, name="output")
    assert_close(x1.grad, x2.grad, dtype=dtype, name="grad_input", atol=1e-4)
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert n1 == n2
        assert_close(p1.grad, p2.grad, dtype=dtype, name=f"grad {n1}", atol=1e-4 * max(1, x.numel() // shape[-1]) ** 0.5)


@pytest.mark.parametrize("name", MODULES)
def test_te_argument_names_defaults_and_parameters(name):
    """CPU only: the default device."""
    cls = MODULES[name][0]
    m = cls(32)
    assert m.eps == 1e-5 and m.zero_centered_gamma is False
    assert m.weight.device.type == te.default_device().type == "cpu"
    assert m.weight.dtype == torch.get_default_dtype()
    expected = {"weight", "bias"} if name == "LayerNorm" else {"weight"}
    assert set(m.state_dict()) == expected
    assert torch.equal(m.weight, torch.ones(32))
    m = cls(normalized_shape=16, eps=1e-6, sequence_parallel=True, params_dtype=torch.bfloat16,
            zero_centered_gamma=True, device="cpu", sm_margin=0)
    assert m.weight.dtype == torch.bfloat16 and m.weight.sequence_parallel is True
    assert torch.equal(m.weight, torch.zeros(16, dtype=torch.bfloat16))


@pytest.mark.parametrize("name", MODULES)
def test_deprecated_hidden_size_keyword(name):
    cls = MODULES[name][0]
    with pytest.warns(DeprecationWarning, match="hidden_size"):
        m = cls(hidden_size=12)
    assert m.normalized_shape == (12,)
    with pytest.raises(ValueError, match="not both"):
        cls(12, hidden_size=12)
    with pytest.raises(ValueError, match="required"):
        cls()


@pytest.mark.parametrize("name", MODULES)
def test_zero_centered_gamma_uses_one_plus_weight(device, name):
    cls = MODULES[name][0]
    centered, plain = cls(48, zero_centered_gamma=True, device=device), cls(48, device=device)
    with torch.no_grad():
        centered.weight.normal_(std=0.1)
        plain.weight.copy_(centered.weight + 1)
    x = torch.randn(4, 48, device=device)
    assert_close(centered(x), plain(x), name="output")


@pytest.mark.parametrize("name", MODULES)
def test_bf16_input_with_fp32_parameters_keeps_input_dtype(device, name):
    ours, theirs = make_pair(name, 96, torch.float32, device=device)
    x = torch.randn(7, 96, dtype=torch.bfloat16, device=device)
    y = ours(x)
    assert y.dtype == torch.bfloat16
    assert_close(y, theirs(x.float()), dtype=torch.bfloat16, name="output")


@pytest.mark.parametrize("name", MODULES)
def test_multi_dimensional_normalized_shape(device, name):
    ours_cls, torch_cls = MODULES[name]
    ours, theirs = ours_cls((4, 6), device=device), torch_cls((4, 6), eps=1e-5, device=device)
    with torch.no_grad():
        ours.weight.normal_()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 4, 6, device=device)
    assert_close(ours(x), theirs(x), name="output")


@pytest.mark.parametrize("name", MODULES)
def test_state_dict_round_trip_and_load_from_torch(device, name):
    ours, theirs = make_pair(name, 40, torch.float32, device=device)
    fresh = MODULES[name][0](40, device=device)
    fresh.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 40, device=device)
    assert torch.equal(fresh(x), ours(x))
    again = MODULES[name][0](40, device=device)
    again.load_state_dict(fresh.state_dict())
    assert torch.equal(again(x), ours(x))


@pytest.mark.parametrize("name", MODULES)
def test_meta_device_then_reset_parameters(device, name):
    m = MODULES[name][0](24, device="meta")
    assert m.weight.is_meta
    y = m(torch.empty(2, 24, device="meta"))
    assert y.shape == (2, 24) and y.is_meta
    m = m.to_empty(device=device)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(24, device=device))


@pytest.mark.parametrize("name", MODULES)
def test_compile_fullgraph_equals_eager(device, name):
    ours = MODULES[name][0](64, device=device)
    with torch.no_grad():
        ours.weight.normal_()
    x = torch.randn(3, 5, 64, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = compiled(x1), ours(x2)
    assert torch.equal(y1, y2)
    y1.sum().backward(), y2.sum().backward()
    assert torch.equal(x1.grad, x2.grad)


@pytest.mark.parametrize("name", MODULES)
def test_wrong_input_width_names_the_sizes(device, name):
    m = MODULES[name][0](32, device=device)
    with pytest.raises(ValueError, match=r"\(4, 31\).*\(32,\)"):
        m(torch.randn(4, 31, device=device))


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("bad", [0, -3, ()])
def test_bad_normalized_shape(name, bad):
    with pytest.raises(ValueError, match="normalized_shape"):
        MODULES[name][0](bad)
