"""Modules under te.autocast(recipe=NVFP4BlockScaling()): te.Linear's three GEMMs are the NVFP4
GEMMs of the recipe's casts, bit for bit (input and output gradient transformed by the random
Hadamard transform for the weight gradient, 16 x 16 weight tiles, stochastic rounding of the
gradient reproducible under torch's seed); LayerNormLinear, LayerNormMLP, GroupedLinear,
te.ops and TransformerLayer forward and backward within NVFP4's error of high precision;
te.quantized_model_init's NVFP4 weights equal to the weights cast on the fly, and their
checkpoint; a small training run that tracks bf16."""
import io

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import NVFP4Quantizer, NVFP4Tensor
from transformer_engine.pytorch.fp8.gemm import fp8_gemm

BF16 = torch.bfloat16
NVFP4 = recipe.NVFP4BlockScaling()
NEAREST = recipe.NVFP4BlockScaling(disable_stochastic_rounding=True)


def _operand(x, **options):
    return NVFP4Quantizer(**options)(x)._storage.operand


def test_available():
    assert te.is_nvfp4_available() and te.is_nvfp4_available(return_reason=True) == (True, "")


def test_linear_gemms_are_the_recipes_casts():
    torch.manual_seed(0)
    lin = te.Linear(64, 48, params_dtype=BF16)
    x = torch.randn(32, 64, dtype=BF16, requires_grad=True)
    with te.autocast(recipe=NEAREST):
        y = lin(x)
    dy = torch.randn(32, 48, dtype=BF16)
    y.backward(dy)
    weight = lin.weight.detach()
    inputs = _operand(x.detach(), with_rht=True, with_post_rht_amax=True)
    weights = _operand(weight, with_2d_quantization=True)
    grads = _operand(dy, with_rht=True, with_post_rht_amax=True)
    assert torch.equal(y, fp8_gemm(inputs, weights, BF16, lin.bias.detach()))
    assert torch.equal(x.grad, fp8_gemm(grads, weights.t(), BF16))  # dgrad: dY [t, out] W [out, in]
    assert torch.equal(lin.weight.grad, fp8_gemm(grads.t(), inputs.t(), BF16))  # wgrad: dY^T X, both transformed


def test_stochastic_rounding_follows_torch_seed():
    lin = te.Linear(64, 48, params_dtype=BF16)
    x = torch.randn(32, 64, dtype=BF16)
    grads = []
    for _ in range(2):
        torch.manual_seed(7)
        leaf = x.clone().requires_grad_()
        with te.autocast(recipe=NVFP4):
            lin(leaf).float().square().sum().backward()
        grads.append(leaf.grad)
        lin.weight.grad = None
    assert torch.equal(*grads)


def _relative(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


MODULES = {
    "Linear": lambda: te.Linear(64, 96, params_dtype=BF16),
    "LayerNormLinear": lambda: te.LayerNormLinear(64, 96, params_dtype=BF16),
    "LayerNormMLP": lambda: te.LayerNormMLP(64, 128, params_dtype=BF16),
    "ops.Sequential": lambda: te.ops.Sequential(te.ops.Linear(64, 64, dtype=BF16), te.ops.GELU(),
                                                te.ops.Linear(64, 32, dtype=BF16)),
}


@pytest.mark.parametrize("name", MODULES)
def test_modules_within_nvfp4s_error(name):
    """4-bit values with a 2^-4-relative scale: about 10% relative error per GEMM operand."""
    torch.manual_seed(1)
    module = MODULES[name]()
    x = torch.randn(48, 64, dtype=BF16, requires_grad=True)
    want = module(x)
    want_grads = torch.autograd.grad(want.float().square().sum(), [x, *module.parameters()])
    with te.autocast(recipe=NVFP4):
        got = module(x)
    got_grads = torch.autograd.grad(got.float().square().sum(), [x, *module.parameters()])
    assert _relative(got, want) < 0.3
    for g, w in zip(got_grads, want_grads):
        assert torch.isfinite(g).all() and _relative(g, w) < 0.5


def test_grouped_linear_and_transformer_layer_run():
    torch.manual_seed(2)
    grouped = te.GroupedLinear(2, 64, 32, params_dtype=BF16)
    layer = te.TransformerLayer(64, 128, 4, params_dtype=BF16, hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(48, 64, dtype=BF16, requires_grad=True)
    h = torch.randn(16, 3, 64, dtype=BF16, requires_grad=True)
    with te.autocast(recipe=NVFP4):
        out = grouped(x, [16, 32])
        hidden = layer(h)
    (out.float().sum() + hidden.float().sum()).backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(h.grad).all()
    assert _relative(out, grouped(x, [16, 32])) < 0.3


def test_quantized_model_init_weights_and_their_checkpoint():
    torch.manual_seed(3)
    with te.quantized_model_init(recipe=NVFP4):
        stored = te.Linear(64, 64, params_dtype=BF16)
    assert isinstance(stored.weight, NVFP4Tensor)
    plain = te.Linear(64, 64, params_dtype=BF16)
    with torch.no_grad():
        plain.weight.copy_(stored.weight.dequantize())
        plain.bias.copy_(stored.bias)
    x = torch.randn(16, 64, dtype=BF16)
    with te.autocast(recipe=NVFP4):
        # the stored codes, and the plain weight (their values) cast again: the same codes
        assert torch.equal(stored(x), plain(x))
    buffer = io.BytesIO()
    torch.save(stored.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # plain tensors: nothing of ours is unpickled
    assert all(type(value) is torch.Tensor for value in state.values())
    with te.quantized_model_init(recipe=NVFP4):
        restored = te.Linear(64, 64, params_dtype=BF16)
    restored.load_state_dict(state)
    with te.autocast(recipe=NVFP4):
        assert torch.equal(restored(x), stored(x))


def test_training_tracks_bf16():
    """A two-layer regression, 60 Adam steps: the NVFP4 run's last losses within 1.5x of bf16's
    (4-bit operands leave a noise floor: 1.26x on this model), both well below the start."""
    def train(fp4):
        torch.manual_seed(4)
        model = torch.nn.Sequential(te.Linear(32, 64, params_dtype=torch.float32), torch.nn.GELU(),
                                    te.Linear(64, 16, params_dtype=torch.float32))
        target = torch.nn.Linear(32, 16)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(60):
            x = torch.randn(64, 32)
            with torch.no_grad():
                y = target(x)
            with te.autocast(enabled=fp4, recipe=NVFP4):
                loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses
    bf16, fp4 = train(False), train(True)
    assert fp4[-1] < 0.5 * fp4[0] and bf16[-1] < 0.5 * bf16[0]
    tail = lambda losses: sum(losses[-10:]) / 10  # noqa: E731
    assert tail(fp4) <= 1.5 * tail(bf16)


def test_the_reference_quantizers_give_the_kernels_bits():
    """TE's reference factory (plain-PyTorch casts) against NVFP4BlockScaling without stochastic
    rounding (the reference has none): the same outputs and gradients, bit for bit."""
    from transformer_engine.pytorch.custom_recipes.quantization_ref_nvfp4 import nvfp4_ref_rht_2d_quantizer_factory
    results = []
    for rec in (NEAREST, recipe.CustomRecipe(qfactory=nvfp4_ref_rht_2d_quantizer_factory)):
        torch.manual_seed(12)
        module = te.LayerNormMLP(64, 96, params_dtype=BF16)
        x = torch.randn(32, 64, dtype=BF16, requires_grad=True)
        with te.autocast(recipe=rec):
            y = module(x)
        y.float().square().sum().backward()
        results.append((y, x.grad, *(p.grad for p in module.parameters())))
    for got, want in zip(*results):
        assert torch.equal(got, want)
