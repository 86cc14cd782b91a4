"""TE main's IdentityQuantizer (a tensor kept in high precision) and HybridQuantizer (each usage
cast by its own quantizer), alone and in the GEMM modules under CustomRecipe factories that mix
them (custom_recipes/quantizer_factory_zoo.py): the forward GEMM reads the row-wise usage, the
backward GEMMs the column-wise one, and operands of different schemes meet in a
high-precision GEMM of their exact values."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import (HybridQuantizedTensor, HybridQuantizer, IdentityQuantizer, MXFP8Quantizer,
                                        NVFP4Quantizer)
from transformer_engine.pytorch.custom_recipes import quantizer_factory_zoo as zoo
from transformer_engine.pytorch.custom_recipes.quantizer_factories import high_precision_factory
from transformer_engine.pytorch.fp8.gemm import fp8_gemm
from transformer_engine.pytorch.quantization import DelayedScalingRequest

E4M3 = torch.float8_e4m3fn
MODULES = {
    "Linear": (lambda: te.Linear(64, 96, params_dtype=torch.bfloat16), lambda m, x: m(x)),
    "LayerNormLinear": (lambda: te.LayerNormLinear(64, 96, params_dtype=torch.bfloat16), lambda m, x: m(x)),
    "LayerNormMLP": (lambda: te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16), lambda m, x: m(x)),
    "GroupedLinear": (lambda: te.GroupedLinear(2, 64, 96, params_dtype=torch.bfloat16), lambda m, x: m(x, [48, 16])),
}


def module_case(name: str, seed: int):
    """(module, its call, input [64, 64] and output gradient, bf16) of MODULES[name]."""
    make, call = MODULES[name]
    torch.manual_seed(seed)
    module = make()
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    return module, call, x, torch.randn(64, 96 if name != "LayerNormMLP" else 64, dtype=torch.bfloat16)


def step(module, call, x, dy, qfactory=None):
    """(output, input gradient, parameter gradients) of one forward + backward."""
    x = x.detach().clone().requires_grad_()
    with te.autocast(enabled=qfactory is not None, recipe=recipe.CustomRecipe(qfactory=qfactory)):
        y = call(module, x)
    grads = torch.autograd.grad(y, [x, *module.parameters()], dy)
    return [y, *grads]


def test_identity_keeps_the_values_and_their_dtype():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    kept = IdentityQuantizer()(x)
    assert type(kept).__name__ == "IdentityTensor" and kept.dtype == torch.bfloat16
    assert torch.equal(kept.dequantize(), x) and torch.equal(kept + 1, x + 1)
    as_fp32 = IdentityQuantizer(dtype=torch.float32)(x)
    assert as_fp32._hp_data.dtype == torch.float32 and torch.equal(as_fp32.dequantize(dtype=torch.float32), x.float())
    with pytest.raises(ValueError, match="high-precision"):
        IdentityQuantizer(dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("source", ["original", "rowwise_dequantized"])
def test_hybrid_casts_each_usage_with_its_own_quantizer(source):
    torch.manual_seed(0)
    x = torch.randn(64, 96) * torch.logspace(-2, 2, 96)
    q = HybridQuantizer(rowwise_quantizer=MXFP8Quantizer(E4M3), columnwise_quantizer=NVFP4Quantizer(),
                        columnwise_source=source)
    h = q(x)
    assert isinstance(h, HybridQuantizedTensor)
    rowwise = MXFP8Quantizer(E4M3, columnwise=False)(x)
    assert torch.equal(h._rowwise_storage._rowwise_data.view(torch.uint8), rowwise._rowwise_data.view(torch.uint8))
    column_source = x if source == "original" else rowwise.dequantize()
    columnwise = NVFP4Quantizer(rowwise=False)(column_source)
    assert torch.equal(h._columnwise_storage._columnwise_data, columnwise._columnwise_data)
    assert torch.equal(h.dequantize(), rowwise.dequantize())  # the values read: the row-wise usage's
    h.update_usage(columnwise_usage=False)
    assert h.get_usages() == {"rowwise": True, "columnwise": False} and h._columnwise_storage is None
    copy = q.copy()
    assert copy.rowwise_quantizer is not q.rowwise_quantizer and copy.columnwise_source == source


def test_hybrid_refuses_what_it_cannot_own():
    shared = MXFP8Quantizer(E4M3)
    with pytest.raises(ValueError, match="distinct"):
        HybridQuantizer(rowwise_quantizer=shared, columnwise_quantizer=shared)
    with pytest.raises(ValueError, match="columnwise_source"):
        HybridQuantizer(rowwise_quantizer=shared, columnwise_quantizer=IdentityQuantizer(), columnwise_source="x")
    with pytest.raises(TypeError, match="request"):
        HybridQuantizer(rowwise_quantizer=DelayedScalingRequest(), columnwise_quantizer=shared)
    with pytest.raises(TypeError, match="must be a Quantizer"):
        HybridQuantizer(rowwise_quantizer=shared, columnwise_quantizer=torch.float32)


@pytest.mark.parametrize("name", list(MODULES))
def test_all_identity_equals_no_recipe_bit_for_bit(name):
    module, call, x, dy = module_case(name, seed=1)
    for got, want in zip(step(module, call, x, dy, high_precision_factory), step(module, call, x, dy)):
        assert torch.equal(got, want)


def mxfp8_values(t, usage="rowwise"):
    q = MXFP8Quantizer(E4M3)(t.detach())
    return getattr(q._storage.operand, usage).dequantize().double()


def test_linear_runs_each_gemm_on_the_usages_its_factory_gave():
    """mxfp8_fwd_high_precision_bwd: fprop on MXFP8 row-wise codes; dgrad and wgrad on the
    MXFP8 values (column-wise Identity cast from them) against the unquantized gradient.
    high_precision_fwd_mxfp8_bwd: fprop unquantized; dgrad and wgrad on MXFP8 column-wise codes."""
    torch.manual_seed(2)
    lin = te.Linear(64, 96, bias=False, params_dtype=torch.float32)
    with torch.no_grad():
        lin.weight.mul_(torch.logspace(-2, 2, 64))
    x, dy = torch.randn(48, 64), torch.randn(48, 96)
    w = lin.weight

    y, dx, dw = step(lin, lambda m, v: m(v), x, dy, zoo.mxfp8_fwd_high_precision_bwd_factory)
    xq, wq = mxfp8_values(x), mxfp8_values(w)
    torch.testing.assert_close(y.double(), xq @ wq.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), dy.double() @ wq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), dy.double().t() @ xq, rtol=1e-5, atol=1e-5)

    y, dx, dw = step(lin, lambda m, v: m(v), x, dy, zoo.high_precision_fwd_mxfp8_bwd_factory)
    assert torch.equal(y, torch.nn.functional.linear(x, w.detach()))
    dyq_row, dyq_col = mxfp8_values(dy), mxfp8_values(dy, "columnwise")
    torch.testing.assert_close(dx.double(), dyq_row @ mxfp8_values(w, "columnwise"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), dyq_col.t() @ mxfp8_values(x, "columnwise"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("factory", [zoo.mxfp8_fwd_nvfp4_bwd_factory, zoo.nvfp4_1d_weight_factory,
                                     zoo.nvfp4_row_scaled_fwd_mxfp8_bwd_factory,
                                     zoo.nvfp4_row_scaled_fwd_high_precision_bwd_factory],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", list(MODULES))
def test_zoo_factories_train_every_module_near_high_precision(factory, name):
    """Each zoo factory through each module: outputs and gradients finite and within the formats'
    error of the unquantized step (NVFP4's 4-bit values: a relative error of about 0.1-0.2)."""
    module, call, x, dy = module_case(name, seed=3)
    for got, want in zip(step(module, call, x, dy, factory), step(module, call, x, dy)):
        assert torch.isfinite(got).all()
        if want.abs().sum() > 0:
            assert ((got.float() - want.float()).norm() / want.float().norm()) < 0.35


def test_a_transformed_nvfp4_operand_does_not_meet_another_scheme():
    x = torch.randn(32, 64)
    transformed = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)(x)._storage.operand.t()
    plain = MXFP8Quantizer(E4M3)(torch.randn(64, 64))._storage.operand.t()
    with pytest.raises(NotImplementedError, match="Hadamard"):
        fp8_gemm(transformed, plain, torch.float32)


@pytest.mark.parametrize("factory", [high_precision_factory, zoo.mxfp8_fwd_high_precision_bwd_factory,
                                     zoo.mxfp8_fwd_nvfp4_bwd_factory], ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", list(MODULES))
def test_weights_stored_by_the_factory_feed_the_gemms(factory, name):
    """te.quantized_model_init under a CustomRecipe stores each weight as its factory's weight
    slot casts it (Identity / Hybrid tensors here), and the module equals one holding the stored
    values in bf16 (through its state_dict) under the same recipe, bit for bit: output and
    input gradient."""
    make, call = MODULES[name]
    custom = recipe.CustomRecipe(qfactory=factory)
    torch.manual_seed(4)
    with te.quantized_model_init(recipe=custom):
        stored = make()
    plain = make()
    plain.load_state_dict({k: v.dequantize() if isinstance(v, te.QuantizedTensor) else v
                           for k, v in stored.state_dict().items()})
    weights = [p for p in stored.parameters() if isinstance(p, te.QuantizedTensor)]
    assert weights and all(type(w).__name__ in ("IdentityTensor", "HybridQuantizedTensor") for w in weights)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    dy = torch.randn(64, 96 if name != "LayerNormMLP" else 64, dtype=torch.bfloat16)
    torch.manual_seed(5)  # the same stochastic-rounding draws for both (nvfp4_factory's gradients)
    got = step(stored, call, x, dy, factory)
    torch.manual_seed(5)
    want = step(plain, call, x, dy, factory)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # output, input gradient
