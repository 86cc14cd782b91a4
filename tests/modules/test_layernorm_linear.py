"""te.LayerNormLinear against plain PyTorch (layer_norm / rms_norm + linear) with copied
parameters; FP8 under every recipe; the fused norm -> FP8 path against te.LayerNorm +
te.Linear; TransformerEngine's names, options and errors."""
import io

import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from numerics import assert_close, assert_two_reference, assert_value_error_naming, sqnr_db

RECIPES = [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(),
           recipe.MXFP8BlockScaling()]
RECIPE_IDS = ["delayed", "current", "block", "mxfp8"]


def reference_norm(x, weight, bias, normalization, eps, zero_centered_gamma):
    """The norm in plain PyTorch, in fp32."""
    gamma = (1 + weight) if zero_centered_gamma else weight
    if normalization == "LayerNorm":
        return F.layer_norm(x, x.shape[-1:], gamma, bias, eps)
    return F.rms_norm(x, x.shape[-1:], gamma, eps)


def reference_forward(m, x, dtype=torch.float32):
    """(y, ln_out, params) of module m in plain PyTorch in `dtype`, differentiable in x and in
    m's parameters, copied as leaves of `dtype` (params: name -> leaf)."""
    params = {name: p.detach().to(dtype).requires_grad_() for name, p in m.named_parameters()}
    weight = torch.cat([params[f"{n}weight"] for n, _ in m.parameter_names])
    bias = torch.cat([params[f"{n}bias"] for n, _ in m.parameter_names]) if m.use_bias else None
    ln = reference_norm(x, params["layer_norm_weight"], params.get("layer_norm_bias"), m.normalization, m.eps,
                        m.zero_centered_gamma)
    return F.linear(ln, weight, bias), ln, params


def run_reference(m, x, dy, dtype):
    """[y, ln_out, grad_input, grad of every parameter] of the plain-PyTorch version in dtype."""
    x = x.detach().to(dtype).requires_grad_()
    y, ln, params = reference_forward(m, x, dtype)
    (y.float() * dy).sum().backward()
    return [y, ln, x.grad] + [params[name].grad for name, _ in m.named_parameters()]


def check_against_reference(m, x, dtype):
    """Output, norm output, input gradient and every parameter gradient of m (dtype) against
    plain PyTorch: fp32 within fp32 tolerances; bf16 by the two-reference rule (error versus
    fp32 at most 2x (forward) / 3x (backward) that of plain PyTorch in bf16)."""
    x_ours = x.to(dtype).requires_grad_()
    y, ln_out = m(x_ours)
    dy = torch.randn(y.shape).to(y.device)
    (y.float() * dy).sum().backward()
    ours = [y, ln_out, x_ours.grad] + [p.grad for p in m.parameters()]
    names = ["output", "ln_out", "grad_input"] + [f"grad {n}" for n, _ in m.named_parameters()]
    exact = run_reference(m, x_ours, dy, torch.float32)
    assert y.dtype == dtype and ln_out.dtype == dtype
    if dtype == torch.float32:
        for got, want, name in zip(ours, exact, names):
            assert_close(got, want, name=name)
        return
    plain = run_reference(m, x_ours, dy, dtype)
    for index, (got, want, low, name) in enumerate(zip(ours, exact, plain, names)):
        assert got.dtype == dtype, name
        assert_two_reference(got, low, want, 2 if index < 2 else 3, name=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("normalization,zero_centered_gamma", [("LayerNorm", False), ("RMSNorm", True)])
@pytest.mark.parametrize("shape", [(3, 5, 37), (0, 37)], ids=str)
def test_matches_plain_pytorch(device, dtype, normalization, zero_centered_gamma, shape):
    m = te.LayerNormLinear(37, 53, normalization=normalization, zero_centered_gamma=zero_centered_gamma,
                           params_dtype=dtype, return_layernorm_output=True, eps=1e-3, device=device)
    with torch.no_grad():  # norm parameters away from their init, so their gradients count
        for p in (m.layer_norm_weight, m.layer_norm_bias, m.bias):
            if p is not None:
                p.copy_(torch.randn_like(p) * 0.5)
    check_against_reference(m, torch.randn(shape, device=device) * 3 + 1, dtype)


def test_non_contiguous_input_and_parameters_split_dict(device):
    m = te.LayerNormLinear(24, 16, parameters_split={"query": 8, "key": 4, "value": 4},
                           return_layernorm_output=True, device=device)
    assert [n for n, _ in m.named_parameters()] == ["layer_norm_weight", "layer_norm_bias", "query_weight",
                                                     "query_bias", "key_weight", "key_bias", "value_weight",
                                                     "value_bias"]
    assert m.query_weight.shape == (8, 24) and m.key_weight.shape == (4, 24)
    x = torch.randn(24, 6, 2, device=device).permute(2, 1, 0)  # [2, 6, 24], not contiguous
    assert not x.is_contiguous()
    check_against_reference(m, x, torch.float32)


def test_state_dict_names_exactly_as_transformer_engine():
    assert list(te.LayerNormLinear(8, 4).state_dict()) == ["layer_norm_weight", "layer_norm_bias", "weight", "bias",
                                                           "_extra_state"]
    assert list(te.LayerNormLinear(8, 4, normalization="RMSNorm", bias=False).state_dict()) == [
        "layer_norm_weight", "weight", "_extra_state"]
    assert list(te.LayerNormLinear(8, 6, parameters_split=("query", "key", "value")).state_dict()) == [
        "layer_norm_weight", "layer_norm_bias", "query_weight", "query_bias", "key_weight", "key_bias",
        "value_weight", "value_bias", "_extra_state"]


def test_defaults_init_and_zero_centered_gamma():
    """CPU only: the default device."""
    m = te.LayerNormLinear(256, 128)
    assert m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
    assert abs(m.weight.std().item() - 0.023) < 0.003 and torch.equal(m.bias, torch.zeros(128))
    assert torch.equal(m.layer_norm_weight, torch.ones(256)) and torch.equal(m.layer_norm_bias, torch.zeros(256))
    assert m.eps == 1e-5 and m.normalization == "LayerNorm"
    z = te.LayerNormLinear(16, 8, zero_centered_gamma=True, init_method=torch.nn.init.ones_)
    assert torch.equal(z.layer_norm_weight, torch.zeros(16)) and torch.equal(z.weight, torch.ones(8, 16))


def test_return_bias_and_layernorm_output(device):
    m = te.LayerNormLinear(12, 5, return_bias=True, return_layernorm_output=True, device=device)
    with torch.no_grad():
        m.bias.fill_(2.0)
    x = torch.randn(4, 12, device=device)
    y, bias, ln_out = m(x)
    assert bias is m.bias
    assert_close(ln_out, F.layer_norm(x, (12,)), name="ln_out")
    assert_close(y, ln_out @ m.weight.t(), name="output without bias")
    y2, bias2 = te.LayerNormLinear(12, 5, return_bias=True, device=device)(x)
    assert y2.shape == (4, 5) and bias2.shape == (5,)
    ln_only = te.LayerNormLinear(12, 5, return_layernorm_output_gathered=True, device=device)(x)
    assert isinstance(ln_only, tuple) and len(ln_only) == 2


def test_fuse_wgrad_accumulation_and_delay_wgrad_compute(device):
    m = te.LayerNormLinear(10, 6, fuse_wgrad_accumulation=True, device=device)
    m.weight.main_grad = torch.ones(6, 10, device=device)
    x, dy = torch.randn(4, 10, device=device), torch.randn(4, 6, device=device)
    m(x).backward(dy)
    assert m.weight.grad is None and m.layer_norm_weight.grad is not None
    assert_close(m.weight.main_grad, 1 + dy.t() @ F.layer_norm(x, (10,)), name="main_grad")
    with pytest.raises(ValueError, match="main_grad"):
        te.LayerNormLinear(10, 6, fuse_wgrad_accumulation=True, device=device)(x)
    eager = te.LayerNormLinear(10, 6, device=device)
    delayed = te.LayerNormLinear(10, 6, delay_wgrad_compute=True, device=device)
    delayed.load_state_dict(eager.state_dict())
    for mod in (eager, delayed):
        mod(x).backward(dy)
    assert delayed.weight.grad is None
    delayed.backward_dw()
    assert torch.equal(delayed.weight.grad, eager.weight.grad)
    assert torch.equal(delayed.layer_norm_weight.grad, eager.layer_norm_weight.grad)


def test_meta_device_then_reset(device):
    m = te.LayerNormLinear(16, 8, device="meta", normalization="RMSNorm")
    assert m.weight.is_meta and m.layer_norm_weight.is_meta and m.layer_norm_bias is None
    m = m.to_empty(device=device)
    m.reset_parameters()
    assert torch.equal(m.layer_norm_weight, torch.ones(16, device=device))
    assert torch.equal(m.bias, torch.zeros(8, device=device))
    assert m.weight.std() > 0


def test_bad_arguments(device):
    assert_value_error_naming(lambda: te.LayerNormLinear(8, 4, normalization="BatchNorm", device=device),
                              ["normalization", "LayerNorm", "RMSNorm", "BatchNorm"])
    assert_value_error_naming(lambda: te.LayerNormLinear(8, 4, device=device)(torch.randn(3, 7, device=device)),
                              ["(3, 7)", "in_features=8"])
    with pytest.raises(NotImplementedError, match="row.*normalization"):
        te.LayerNormLinear(8, 4, parallel_mode="row", tp_size=2)
    column = te.LayerNormLinear(8, 4, parallel_mode="column", tp_size=2, device=device)  # this rank's rows
    assert column.weight.shape == (2, 8) and column.out_features == 2
    with pytest.raises(RuntimeError, match="tp_size=2 needs torch.distributed"):
        column(torch.randn(3, 8, device=device))


def test_compile_fullgraph_equals_eager(device):
    m = te.LayerNormLinear(24, 12, normalization="RMSNorm", return_layernorm_output=True, device=device)
    x1 = torch.randn(5, 24, requires_grad=True, device=device)
    x2 = x1.detach().clone().requires_grad_()
    torch._dynamo.reset()
    y1, ln1 = torch.compile(m, fullgraph=True)(x1)
    y1.sum().backward()
    grads1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    y2, ln2 = m(x2)
    y2.sum().backward()
    assert torch.equal(y1, y2) and torch.equal(ln1, ln2) and torch.equal(x1.grad, x2.grad)
    for a, (name, p) in zip(grads1, m.named_parameters()):  # compiled reductions may round differently
        assert_close(a, p.grad, name=name)


# --- FP8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_fp8_forward_backward_close_to_high_precision(device, rec, normalization):
    assert_fp8_step_close(te.LayerNormLinear(256, 128, normalization=normalization, device=device), rec,
                          grad_floor_db=12)


def assert_fp8_step_close(m: torch.nn.Module, rec, grad_floor_db: float) -> None:
    """A training step of m on x [2, 32, 256] under `rec` (after one step that lets delayed
    scaling learn its scales): finite, forward SQNR >= 18 dB against high precision, and every
    gradient (input and parameters) at least grad_floor_db."""
    device = next(m.parameters()).device
    x = (torch.randn(2, 32, 256, device=device) * 2 + 0.5).requires_grad_()
    y_exact = m(x)
    y_exact.square().sum().backward()
    exact = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    for _ in range(2):
        x.grad = None
        m.zero_grad()
        with te.autocast(recipe=rec):
            y = m(x)
        y.square().sum().backward()
    assert torch.isfinite(y).all() and sqnr_db(y_exact, y) >= 18
    for name, want, got in zip(["input"] + [n for n, _ in m.named_parameters()], exact,
                               [x.grad] + [p.grad for p in m.parameters()]):
        assert torch.isfinite(got).all(), name
        assert sqnr_db(want, got) >= grad_floor_db, name


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_fused_norm_fp8_equals_norm_then_linear(device, normalization):
    """Delayed scaling: the fused norm -> FP8 kernel gives, step after step, the outputs,
    gradients and scales of te.LayerNorm / te.RMSNorm followed by te.Linear."""
    torch.manual_seed(7)
    fused = te.LayerNormLinear(40, 24, normalization=normalization, zero_centered_gamma=True, device=device)
    with torch.no_grad():
        fused.layer_norm_weight.normal_(0, 0.3)
    norm = (te.LayerNorm if normalization == "LayerNorm" else te.RMSNorm)(40, zero_centered_gamma=True,
                                                                          device=device)
    linear = te.Linear(40, 24, device=device)
    norm.load_state_dict({k[len("layer_norm_"):]: v for k, v in fused.state_dict().items()
                          if k.startswith("layer_norm")})
    linear.load_state_dict({"weight": fused.weight.detach(), "bias": fused.bias.detach()})
    r = recipe.DelayedScaling(amax_history_len=4, margin=1)
    for step in range(3):
        x = torch.randn(6, 40, device=device) * (1 + step)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        with te.autocast(recipe=r):
            y1 = fused(x1)
            y2 = linear(norm(x2))
        dy = torch.randn_like(y1)
        y1.backward(dy), y2.backward(dy)
        assert torch.equal(y1, y2), step
        assert torch.equal(x1.grad, x2.grad), step
        assert torch.equal(fused.weight.grad, linear.weight.grad), step
        assert torch.equal(fused.layer_norm_weight.grad, norm.weight.grad), step
        for direction in ("scaling_fwd", "scaling_bwd"):
            assert torch.equal(fused.fp8_meta[direction].amax_history, linear.fp8_meta[direction].amax_history)
            assert torch.equal(fused.fp8_meta[direction].scale, linear.fp8_meta[direction].scale)
        for p in (*fused.parameters(), *norm.parameters(), *linear.parameters()):
            p.grad = None


def test_fp8_meta_slots_and_layernorm_output_under_fp8(device):
    m = te.LayerNormLinear(32, 16, return_layernorm_output=True, device=device)
    x = torch.randn(8, 32, device=device) * 3
    with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)):
        y, ln_out = m(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    ln_exact = F.layer_norm(x, (32,))
    assert_close(ln_out, ln_exact, name="ln_out")  # the high-precision norm, written by the fused kernel
    fwd, bwd = m.fp8_meta["scaling_fwd"], m.fp8_meta["scaling_bwd"]
    assert fwd.amax_history.shape == (4, 3) and bwd.amax_history.shape == (4, 2)
    # after the update the step's amaxes sit in the last row: [input, weight, output]
    assert_close(fwd.amax_history[-1, 0], ln_exact.abs().max(), name="input amax")
    assert torch.equal(fwd.amax_history[-1, 1], m.weight.detach().abs().max())
    assert torch.equal(bwd.amax_history[-1, 0], dy.abs().max())
    assert torch.equal(fwd.scale_inv, 1 / fwd.scale)


def trained_and_reloaded(make, r):
    """(a, b): a = make() after two FP8 training steps under r on [8, 32] inputs (weights cast
    with is_first_microbatch=True), b = a fresh make() loaded from a's saved state_dict."""
    a = make()
    device = next(a.parameters()).device
    for _ in range(2):
        with te.autocast(recipe=r):
            y = a(torch.randn(8, 32, device=device), is_first_microbatch=True)
        y.sum().backward()
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b = make()
    b.load_state_dict(torch.load(buffer, weights_only=True))
    return a, b


def test_fp8_state_dict_round_trip_and_microbatch_cache(device):
    r = recipe.DelayedScaling(amax_history_len=4)
    a, b = trained_and_reloaded(lambda: te.LayerNormLinear(32, 16, normalization="RMSNorm", device=device), r)
    assert torch.equal(b.fp8_meta["scaling_fwd"].scale, a.fp8_meta["scaling_fwd"].scale)
    x = torch.randn(8, 32, device=device)
    with te.autocast(recipe=r):
        ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)
    with torch.no_grad():
        a.weight.mul_(100)  # would change the weight amax if it were cast again
    weight_amax = a.fp8_meta["scaling_fwd"].amax_history[:, 1].max()
    with te.autocast(recipe=r):
        a(x, is_first_microbatch=False)
    assert a.fp8_meta["scaling_fwd"].amax_history[:, 1].max() <= weight_amax


@pytest.mark.parametrize("rec", [recipe.DelayedScaling(), recipe.MXFP8BlockScaling()], ids=["delayed", "mxfp8"])
def test_fp8_zero_tokens_and_bf16(device, rec):
    m = te.LayerNormLinear(64, 32, params_dtype=torch.bfloat16, device=device)
    for shape in ((0, 64), (2, 3, 64)):
        x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True, device=device)
        with te.autocast(recipe=rec):
            y = m(x)
        y.float().sum().backward()
        assert y.shape == (*shape[:-1], 32) and y.dtype == torch.bfloat16 and x.grad.shape == x.shape
        assert torch.isfinite(m.weight.grad).all() and torch.isfinite(m.layer_norm_weight.grad).all()
