"""FP8 state is fp32 whatever torch.get_default_dtype() is (PyTorch Lightning sets bf16 for
bf16 weights): training under every recipe, te.quantized_model_init and _extra_state round trips
with the default dtype set to bf16."""
import contextlib
import io

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

RECIPES = {"delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling,
           "block": recipe.Float8BlockScaling, "mxfp8": recipe.MXFP8BlockScaling}
MODULES = {
    "Linear": (lambda: te.Linear(128, 64), lambda m, x: m(x)),
    "LayerNormLinear": (lambda: te.LayerNormLinear(128, 64), lambda m, x: m(x)),
    "LayerNormMLP": (lambda: te.LayerNormMLP(128, 128), lambda m, x: m(x)),
    "GroupedLinear": (lambda: te.GroupedLinear(2, 128, 64), lambda m, x: m(x, [32, 32])),
}


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def assert_fp8_state_is_fp32(module):
    """The scaling state (scale, scale_inv, amax_history) is fp32; amax_recorded is a bool mask."""
    for name, tensor in module.fp8_meta.named_buffers():
        expected = torch.bool if name.endswith("amax_recorded") else torch.float32
        assert tensor.dtype == expected, f"fp8_meta.{name} is {tensor.dtype}"


def train(module, call, rec, steps=3):
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(64, 128)
        with te.autocast(recipe=rec):
            loss = call(module, x).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert torch.isfinite(loss), f"loss {loss}"


@pytest.mark.parametrize("rec", RECIPES)
@pytest.mark.parametrize("name", MODULES)
def test_training_under_a_bf16_default_dtype(name, rec):
    make, call = MODULES[name]
    with default_dtype(torch.bfloat16):
        module = make()
        assert next(module.parameters()).dtype == torch.bfloat16
        train(module, call, RECIPES[rec]())
        assert_fp8_state_is_fp32(module)


@pytest.mark.parametrize("rec", RECIPES)
def test_quantized_model_init_under_a_bf16_default_dtype(rec):
    with default_dtype(torch.bfloat16):
        with te.quantized_model_init(recipe=RECIPES[rec]()):
            module = te.Linear(128, 64)
        assert isinstance(module.weight, te.QuantizedTensor) and module.weight.dtype == torch.bfloat16
        train(module, MODULES["Linear"][1], RECIPES[rec]())
        assert_fp8_state_is_fp32(module)


def test_extra_state_round_trip_under_a_bf16_default_dtype():
    with default_dtype(torch.bfloat16):
        source, target = te.Linear(128, 64), te.Linear(128, 64)
        train(source, MODULES["Linear"][1], recipe.DelayedScaling(amax_history_len=4))
        buffer = io.BytesIO()
        torch.save(source.state_dict(), buffer)
        buffer.seek(0)
        target.load_state_dict(torch.load(buffer, weights_only=True))
        assert_fp8_state_is_fp32(target)
        for name, tensor in source.fp8_meta.named_buffers():
            assert torch.equal(target.fp8_meta.get_buffer(name), tensor), name
        train(target, MODULES["Linear"][1], recipe.DelayedScaling(amax_history_len=4))
