"""Bad input to the public modules: refused with a TypeError / ValueError that names the module,
the argument and the dtype or shape, never computed on (integer input gave zeros) and never a
bare IndexError / AttributeError."""
import re

import pytest
import torch

import transformer_engine.pytorch as te

# name -> (constructor, call(module, x) with x the tensor under test in the checked argument,
# the argument name in the message, a valid floating-point input)
MODULES = {
    "Linear": (lambda: te.Linear(16, 8), lambda m, x: m(x), "inp", torch.ones(4, 16)),
    "LayerNormLinear": (lambda: te.LayerNormLinear(16, 8), lambda m, x: m(x), "inp", torch.ones(4, 16)),
    "LayerNormMLP": (lambda: te.LayerNormMLP(16, 32), lambda m, x: m(x), "inp", torch.ones(4, 16)),
    "GroupedLinear": (lambda: te.GroupedLinear(2, 16, 8), lambda m, x: m(x, [2, 2]), "inp", torch.ones(4, 16)),
    "LayerNorm": (lambda: te.LayerNorm(16), lambda m, x: m(x), "inp", torch.ones(4, 16)),
    "RMSNorm": (lambda: te.RMSNorm(16), lambda m, x: m(x), "inp", torch.ones(4, 16)),
    "Fp8Padding": (lambda: te.Fp8Padding(2), lambda m, x: m(x, [2, 2]), "inp", torch.ones(4, 16)),
    "Fp8Unpadding": (lambda: te.Fp8Unpadding(2, align_size=2), lambda m, x: m(x, [2, 2]), "inp",
                     torch.ones(4, 16)),
    "DotProductAttention": (lambda: te.DotProductAttention(2, 8), lambda m, x: m(x, x, x), "query_layer",
                            torch.ones(3, 1, 2, 8)),
    "MultiheadAttention": (lambda: te.MultiheadAttention(16, 2), lambda m, x: m(x), "hidden_states",
                           torch.ones(3, 1, 16)),
    "TransformerLayer": (lambda: te.TransformerLayer(16, 32, 2), lambda m, x: m(x), "hidden_states",
                         torch.ones(3, 1, 16)),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8], ids=str)
@pytest.mark.parametrize("name", MODULES)
def test_non_floating_input_is_refused(name, dtype):
    make, call, arg, valid = MODULES[name]
    module = make()
    call(module, valid)  # the floating-point input works
    with pytest.raises(TypeError, match=rf"{name}: {arg} must be a floating-point tensor, got dtype "
                                        rf"{re.escape(str(dtype))}"):
        call(module, valid.to(dtype))


@pytest.mark.parametrize("name", MODULES)
def test_zero_dim_input_is_refused(name):
    make, call, arg, _ = MODULES[name]
    with pytest.raises(ValueError, match=rf"{name}: {arg} must have at least 1 dimension\(s\), got shape \(\)"):
        call(make(), torch.tensor(1.0))


@pytest.mark.parametrize("name", MODULES)
def test_non_tensor_input_is_refused(name):
    make, call, arg, valid = MODULES[name]
    with pytest.raises(TypeError, match=rf"{name}: {arg} must be a torch.Tensor, got list"):
        call(make(), valid.tolist())


def test_integer_key_and_value_layers_are_refused():
    attention = te.DotProductAttention(2, 8)
    q = torch.ones(3, 1, 2, 8)
    with pytest.raises(TypeError, match="DotProductAttention: key_layer .* torch.int64"):
        attention(q, q.long(), q)
    with pytest.raises(TypeError, match="DotProductAttention: value_layer .* torch.int32"):
        attention(q, q, q.int())


def test_integer_encoder_output_is_refused():
    layer = te.TransformerLayer(16, 32, 2, layer_type="decoder")
    x = torch.ones(3, 1, 16)
    with pytest.raises(TypeError, match="MultiheadAttention: encoder_output .* torch.int64"):
        layer(x, encoder_output=x.long())
