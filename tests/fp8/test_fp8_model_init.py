"""te.quantized_model_init / te.fp8_model_init: weights stored in FP8 (QuantizedTensor) for
every recipe, used as they are by FP8 GEMMs, read as their dequantised values elsewhere,
re-quantised on every write (optimizer steps, load_state_dict), checkpoints as plain
tensors."""
import io

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import reference
from numerics import assert_fp8_gemm_result, sqnr_db

RECIPES = [None, recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(), recipe.MXFP8BlockScaling()]
IDS = ["default-delayed", "current", "block", "mxfp8"]


def fp8_linear(rec, *args, preserve=False, **kwargs):
    with te.quantized_model_init(recipe=rec, preserve_high_precision_init_val=preserve):
        return te.Linear(*args, **kwargs)


@pytest.mark.parametrize("rec", RECIPES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weights_are_fp8_parameters_close_to_their_init(rec, dtype):
    m = fp8_linear(rec, 256, 96, params_dtype=dtype, preserve=True)
    w = m.weight
    assert isinstance(w, te.QuantizedTensor) and isinstance(w, torch.nn.Parameter) and w.requires_grad
    assert w.dtype == dtype and w.shape == (96, 256) and w.fp8_dtype == torch.float8_e4m3fn
    assert not isinstance(m.bias, te.QuantizedTensor)
    init = w.get_high_precision_init_val()
    assert init.device.type == "cpu" and init.dtype == dtype
    assert sqnr_db(init.float(), w.dequantize(torch.float32)) >= 25
    w.clear_high_precision_init_val()
    assert w.get_high_precision_init_val() is None


def test_outside_autocast_the_weight_reads_as_its_dequantised_values():
    m = fp8_linear(None, 40, 24)
    x = torch.randn(7, 40)
    want = x @ m.weight.dequantize().t() + m.bias
    assert torch.equal(m(x), want)
    assert torch.equal(m.weight * 2, m.weight.dequantize() * 2) and type(m.weight * 2) is torch.Tensor


def test_fp8_forward_uses_the_stored_codes_without_a_weight_cast():
    m = fp8_linear(recipe.DelayedScaling(), 64, 32)
    x = torch.randn(16, 64)
    with te.autocast(recipe=recipe.DelayedScaling()):
        y = m(x)
    x_q = reference.fp8_dequantize(reference.fp8_quantize(x, torch.ones(1), torch.float8_e4m3fn)[0], torch.ones(1),
                                   torch.float32)
    assert_fp8_gemm_result(y, x_q, m.weight.dequantize(), m.bias)
    assert m.fp8_meta["scaling_fwd"].amax_history[0, 1] == 0, "the weight was not cast again"


@pytest.mark.parametrize("rec", RECIPES, ids=IDS)
def test_gradients_match_a_module_with_the_same_values(rec):
    torch.manual_seed(1)
    fp8 = fp8_linear(rec, 160, 72)
    plain = te.Linear(160, 72)
    with torch.no_grad():
        plain.weight.copy_(fp8.weight.dequantize())
        plain.bias.copy_(fp8.bias)
    x = torch.randn(33, 160)
    active = rec or recipe.DelayedScaling()
    outs = []
    for m in (fp8, plain):
        xr = x.clone().requires_grad_()
        with te.autocast(recipe=active):
            y = m(xr)
        y.square().sum().backward()
        outs.append((y, xr.grad, m.weight.grad))
    if not active.delayed():  # delayed scaling casts `plain`'s weight with scale 1 on step one
        for a, b in zip(outs[0], outs[1]):
            assert sqnr_db(b, a) >= 40
    assert type(fp8.weight.grad) is torch.Tensor and fp8.weight.grad.shape == (72, 160)


@pytest.mark.parametrize("rec", RECIPES, ids=IDS)
def test_optimizer_steps_requantise_and_training_learns(rec):
    torch.manual_seed(4)
    m = torch.nn.Sequential(fp8_linear(rec, 32, 64), torch.nn.GELU(), fp8_linear(rec, 64, 4))
    optimizer = torch.optim.AdamW(m.parameters(), lr=1e-2)
    target_w = torch.randn(4, 32)
    losses = []
    for _ in range(60):
        x = torch.randn(128, 32)
        with te.autocast(recipe=rec or recipe.DelayedScaling()):
            loss = torch.nn.functional.mse_loss(m(x), x @ target_w.t())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(isinstance(layer.weight, te.QuantizedTensor) for layer in (m[0], m[2]))
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses[::10]


@pytest.mark.parametrize("rec", RECIPES, ids=IDS)
def test_state_dict_is_plain_tensors_and_loads_both_ways(rec):
    m = fp8_linear(rec, 48, 16)
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert type(state["weight"]) is torch.Tensor and torch.equal(state["weight"], m.weight.dequantize())
    plain = torch.nn.Linear(48, 16)
    plain.load_state_dict({k: v for k, v in state.items() if k != "_extra_state"})
    source = torch.nn.Linear(48, 16)
    m.load_state_dict(source.state_dict())  # re-quantised on the way in
    assert isinstance(m.weight, te.QuantizedTensor)
    assert sqnr_db(source.weight.detach(), m.weight.dequantize()) >= 25


@pytest.mark.parametrize("step_before_saving", [False, True], ids=["scales_moved_since_the_cast", "after_a_step"])
def test_delayed_scaling_weights_resume_bit_exactly(step_before_saving):
    """Under DelayedScaling a weight's codes keep the scale they were cast with while its slot's
    scale moves on (each forward's update): a checkpoint brings back those codes and that
    scale_inv, not a re-cast with the slot's newer scale, so the next step is the same bits."""
    rec = recipe.DelayedScaling(amax_history_len=1, amax_compute_algo="most_recent")
    with te.quantized_model_init(recipe=rec):
        m = te.LayerNormMLP(32, 64, params_dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    for _ in range(3):
        with te.autocast(recipe=rec):
            m(x).float().pow(2).mean().backward()
        if step_before_saving:
            optimizer.step()
            optimizer.zero_grad()
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    with te.quantized_model_init(recipe=rec):
        restored = te.LayerNormMLP(32, 64, params_dtype=torch.bfloat16)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for name in ("fc1_weight", "fc2_weight"):
        ours, theirs = getattr(restored, name), getattr(m, name)
        assert torch.equal(ours._scale_inv, theirs._scale_inv), name
        assert torch.equal(ours.dequantize(), theirs.dequantize()), name
    assert torch.equal(restored.fp8_meta.scaling_fwd.scale, m.fp8_meta.scaling_fwd.scale)
    with te.autocast(recipe=rec):
        assert torch.equal(restored(x), m(x))


def test_writes_through_any_alias_are_seen_and_requantised():
    m = fp8_linear(None, 16, 8)
    with torch.no_grad():
        m.weight.detach().fill_(0.5)
    assert torch.equal(m.weight.dequantize(), torch.full((8, 16), 0.5))
    with torch.no_grad():
        m.weight.mul_(3.0)  # 1.5: exactly representable
    assert torch.equal(m.weight.dequantize(), torch.full((8, 16), 1.5))
    assert isinstance(m.weight, te.QuantizedTensor)


def test_disabled_old_name_meta_device_and_errors():
    with te.fp8_model_init(enabled=False):
        assert not isinstance(te.Linear(8, 4).weight, te.QuantizedTensor)
    with te.fp8_model_init():
        meta = te.Linear(8, 4, device="meta")
    assert not isinstance(te.Linear(8, 4).weight, te.QuantizedTensor), "the region ended"
    meta = meta.to_empty(device="cpu")
    meta.reset_parameters()
    assert isinstance(meta.weight, te.QuantizedTensor) and meta.weight.dequantize().std() > 0
    with pytest.raises(ValueError, match="recipe"):
        with te.quantized_model_init(recipe="mxfp8"):
            pass
