"""te.Linear: against torch.nn.Linear in high precision; in FP8 against a quantise-dequantise
emulation with the scales in force at each step; scale sequences; checkpoints; TE's options."""
import io

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import reference
from numerics import assert_close, assert_fp8_gemm_result, fp32_quotient, sqnr_db

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def pair(in_features, out_features, dtype=torch.float32, bias=True, device="cpu"):
    ours = te.Linear(in_features, out_features, bias=bias, params_dtype=dtype, device=device)
    theirs = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)
    theirs.load_state_dict(ours.state_dict(), strict=False)
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(7, 33), (2, 5, 33), (0, 33)], ids=str)
def test_matches_torch_linear(device, dtype, shape):
    ours, theirs = pair(33, 19, dtype, device=device)
    x = torch.randn(shape, dtype=dtype, device=device)
    dy = torch.randn(*shape[:-1], 19, dtype=dtype, device=device)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), theirs(x2)
    y1.backward(dy), y2.backward(dy)
    tol = {} if dtype == torch.float32 else {"atol": 1e-2}
    assert_close(y1, y2, name="output", **tol)
    assert_close(x1.grad, x2.grad, name="grad_input", **tol)
    assert_close(ours.weight.grad, theirs.weight.grad, name="grad_weight", **tol)
    assert_close(ours.bias.grad, theirs.bias.grad, name="grad_bias", **tol)


def test_defaults_names_and_init():
    """CPU only: the default device."""
    m = te.Linear(256, 512)
    assert set(m.state_dict()) == {"weight", "bias", "_extra_state"}
    assert m.weight.shape == (512, 256) and m.weight.device.type == "cpu"
    assert abs(m.weight.std().item() - 0.023) < 0.002 and torch.equal(m.bias, torch.zeros(512))


def test_return_bias_and_no_bias(device):
    m = te.Linear(8, 4, return_bias=True, device=device)
    with torch.no_grad():
        m.bias.fill_(3.0)
    x = torch.randn(2, 8, device=device)
    y, b = m(x)
    assert b is m.bias and torch.allclose(y, x @ m.weight.t())
    no_bias = te.Linear(8, 4, bias=False, device=device)
    assert no_bias.bias is None and set(no_bias.state_dict()) == {"weight", "_extra_state"}
    assert torch.equal(no_bias(x), x @ no_bias.weight.t())


def test_parameters_split_names_and_equivalence(device):
    m = te.Linear(6, 9, parameters_split=("query", "key", "value"), device=device)
    assert set(m.state_dict()) == {"query_weight", "key_weight", "value_weight", "query_bias", "key_bias",
                                   "value_bias", "_extra_state"}
    x = torch.randn(3, 6, device=device)
    w = torch.cat([m.query_weight, m.key_weight, m.value_weight])
    b = torch.cat([m.query_bias, m.key_bias, m.value_bias])
    assert_close(m(x), x @ w.t() + b, name="output")
    with pytest.raises(ValueError, match="divisible"):
        te.Linear(6, 10, parameters_split=("a", "b", "c"), device=device)
    sized = te.Linear(6, 10, parameters_split={"a": 4, "b": 6}, device=device)
    assert sized.a_weight.shape == (4, 6) and sized.b_weight.shape == (6, 6)


def test_fuse_wgrad_accumulation_uses_main_grad(device):
    m = te.Linear(5, 3, fuse_wgrad_accumulation=True, device=device)
    m.weight.main_grad = torch.ones(3, 5, device=device)
    x, dy = torch.randn(4, 5, device=device), torch.randn(4, 3, device=device)
    m(x).backward(dy)
    assert m.weight.grad is None
    assert_close(m.weight.main_grad, 1 + dy.t() @ x, name="main_grad")
    with pytest.raises(ValueError, match="main_grad"):
        te.Linear(5, 3, fuse_wgrad_accumulation=True, device=device)(torch.randn(2, 5, device=device))


def test_errors_and_refusals(device):
    with pytest.raises(ValueError, match=r"\(4, 7\).*in_features=8"):
        te.Linear(8, 2, device=device)(torch.randn(4, 7, device=device))
    column = te.Linear(8, 2, tp_size=2, parallel_mode="column", device=device)  # this rank's output rows
    assert column.weight.shape == (1, 8) and column.weight.partition_dim == 0
    with pytest.raises(RuntimeError, match="tp_size=2 needs torch.distributed"):
        column(torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="in_features=7.*2 tensor-parallel ranks"):
        te.Linear(7, 2, tp_size=2, parallel_mode="row")
    with pytest.raises(ValueError, match="parallel_mode.*'diagonal'"):
        te.Linear(8, 2, parallel_mode="diagonal")
    for mode in ("column", "row"):  # what Megatron passes, on one rank: an ordinary Linear
        assert te.Linear(8, 2, parallel_mode=mode, device=device)(torch.randn(4, 8, device=device)).shape == (4, 2)


@pytest.mark.parametrize("fp8", [False, True])
def test_delay_wgrad_compute_defers_weight_gradients_to_backward_dw(device, fp8):
    torch.manual_seed(5)
    eager, delayed = te.Linear(12, 6, device=device), te.Linear(12, 6, delay_wgrad_compute=True, device=device)
    delayed.load_state_dict(eager.state_dict())
    xs = [torch.randn(5, 12, device=device) for _ in range(2)]
    grads_x = []
    for m in (eager, delayed):
        for x in xs:
            xr = x.clone().requires_grad_()
            with te.autocast(enabled=fp8):
                y = m(xr)
            y.square().sum().backward()
            grads_x.append(xr.grad)
    assert delayed.weight.grad is None and delayed.bias.grad is None, "nothing until backward_dw()"
    delayed.backward_dw()
    assert torch.equal(grads_x[0], grads_x[2]) and torch.equal(grads_x[1], grads_x[3])
    assert torch.equal(delayed.weight.grad, eager.weight.grad)
    assert torch.equal(delayed.bias.grad, eager.bias.grad)
    delayed.backward_dw()  # nothing pending: no change
    assert torch.equal(delayed.weight.grad, eager.weight.grad)


def test_loads_plain_torch_linear_checkpoint(device):
    theirs = torch.nn.Linear(12, 7, device=device)
    ours = te.Linear(12, 7, device=device)
    ours.load_state_dict(theirs.state_dict())  # strict, no _extra_state in it
    x = torch.randn(3, 12, device=device)
    assert torch.equal(ours(x), theirs(x))


def test_meta_device_then_reset(device):
    m = te.Linear(16, 8, device="meta")
    assert m.weight.is_meta
    m = m.to_empty(device=device)
    m.reset_parameters()
    assert torch.equal(m.bias, torch.zeros(8, device=device)) and m.weight.std() > 0


# --- FP8 ------------------------------------------------------------------------------------

def emulate(x, w, dy, s_x, s_w, s_dy, fwd_dtype=E4M3, bwd_dtype=E5M2):
    """Quantise-dequantise emulation of one FP8 Linear step with the given scales: the
    dequantised operands (fp32) of its three GEMMs, and the amaxes of x, w and dy."""
    def qdq(t, s, dtype):
        data, amax = reference.fp8_quantize(t, s.reshape(1), dtype)
        return reference.fp8_dequantize(data, 1 / s.reshape(1), torch.float32), amax
    xq, x_amax = qdq(x, s_x, fwd_dtype)
    wq, w_amax = qdq(w, s_w, fwd_dtype)
    dyq, dy_amax = qdq(dy, s_dy, bwd_dtype)
    return xq, wq, dyq, (x_amax, w_amax, dy_amax)


def assert_fp8_linear_step(y, grad_input, grad_weight, xq, wq, dyq, bias):
    """The three GEMMs of an FP8 Linear step, each the exact product of the dequantised
    operands rounded once (TE's numerics)."""
    assert_fp8_gemm_result(y, xq, wq, bias, name="y")
    assert_fp8_gemm_result(grad_input, dyq, wq.t(), name="grad_input")
    assert_fp8_gemm_result(grad_weight, dyq.t(), xq.t(), name="grad_weight")


def test_fp8_delayed_scaling_equals_emulation_and_scale_sequence(cpu_gemm):
    """CPU only, on each CPU GEMM (cpu_gemm): the exact-product-rounded-once check is of the CPU's
    GEMMs (accelerators' FP8 tensor cores may accumulate in less than fp32)."""
    torch.manual_seed(0)
    r = recipe.DelayedScaling(margin=2, fp8_format=recipe.Format.HYBRID, amax_history_len=8)
    m = te.Linear(64, 48)
    x_amaxes, dy_amaxes = [], []
    for step in range(5):
        x = torch.randn(32, 64) * (1 + step)
        dy = torch.randn(32, 48) * 1e-3 * (5 - step)
        s_x, s_w = (m.fp8_meta["scaling_fwd"].scale[:2].clone() if m.fp8_meta is not None else torch.ones(2))
        s_dy = m.fp8_meta["scaling_bwd"].scale[0].clone() if m.fp8_meta is not None else torch.tensor(1.0)
        *operands, amaxes = emulate(x, m.weight.detach(), dy, s_x, s_w, s_dy)
        xr = x.clone().requires_grad_()
        with te.autocast(recipe=r):
            y = m(xr)
        y.backward(dy)
        assert_fp8_linear_step(y, xr.grad, m.weight.grad, *operands, m.bias.detach())
        assert_close(m.bias.grad, dy.sum(0), name="grad_bias")
        m.weight.grad = m.bias.grad = None
        x_amaxes.append(amaxes[0].item())
        dy_amaxes.append(amaxes[2].item())
        # the worked check of TE_API.md section 4
        fwd, bwd = m.fp8_meta["scaling_fwd"], m.fp8_meta["scaling_bwd"]
        assert torch.equal(fwd.scale[0], fp32_quotient(448.0, max(x_amaxes)) / 4)
        assert torch.equal(bwd.scale[0], fp32_quotient(57344.0, max(dy_amaxes)) / 4)
        assert torch.equal(fwd.scale_inv, 1 / fwd.scale)


def test_fp8_current_scaling_equals_emulation(cpu_gemm):
    """CPU only, on each CPU GEMM (as the test above)."""
    torch.manual_seed(1)
    m = te.Linear(40, 24)
    x, dy = torch.randn(16, 40) * 3, torch.randn(16, 24)
    r = recipe.Float8CurrentScaling()
    from transformer_engine.pytorch.scaling import current_scale
    s = [current_scale(t.abs().amax().reshape(1), mx) for t, mx in ((x, 448.0), (m.weight.detach(), 448.0),
                                                                    (dy, 57344.0))]
    *operands, _ = emulate(x, m.weight.detach(), dy, *s)
    xr = x.clone().requires_grad_()
    with te.autocast(recipe=r):
        y = m(xr)
    y.backward(dy)
    assert_fp8_linear_step(y, xr.grad, m.weight.grad, *operands, m.bias.detach())


@pytest.mark.parametrize("rec", [recipe.DelayedScaling(), recipe.Float8CurrentScaling()], ids=["delayed", "current"])
def test_fp8_forward_sqnr(device, rec):
    torch.manual_seed(2)
    m = te.Linear(256, 128, device=device)
    x = torch.randn(64, 256, device=device)
    exact = m(x)
    for _ in range(2):  # delayed scaling needs one step to learn its scales
        with te.autocast(recipe=rec):
            y = m(x)
    assert sqnr_db(exact, y) >= 18


def test_saturation_gives_finite_outputs(device):
    m = te.Linear(16, 8, device=device)
    with te.autocast(recipe=recipe.DelayedScaling()):
        m(torch.randn(4, 16, device=device))  # learn small scales
    with te.autocast(recipe=recipe.DelayedScaling()):
        y = m(torch.randn(4, 16, device=device) * 1e6)  # far beyond the learned range: saturates
    assert torch.isfinite(y).all()


def test_nan_never_poisons_the_scales(device):
    m = te.Linear(8, 4, device=device)
    with te.autocast():
        m(torch.randn(3, 8, device=device))
    scale = m.fp8_meta["scaling_fwd"].scale.clone()
    bad = torch.randn(3, 8, device=device)
    bad[0, 0] = float("nan")
    with te.autocast():
        m(bad)
    assert torch.equal(m.fp8_meta["scaling_fwd"].scale[0], scale[0])
    assert torch.isfinite(m.fp8_meta["scaling_fwd"].scale).all()


def test_is_first_microbatch_caches_the_weight(device):
    m = te.Linear(16, 8, device=device)
    r = recipe.DelayedScaling(amax_history_len=4)
    with te.autocast(recipe=r):
        m(torch.randn(4, 16, device=device), is_first_microbatch=True)
    with torch.no_grad():
        m.weight.mul_(100)  # would change the weight amax if it were re-cast
    with te.autocast(recipe=r):
        m(torch.randn(4, 16, device=device), is_first_microbatch=False)
    history = m.fp8_meta["scaling_fwd"].amax_history
    assert history[:, 1].max() < 1.0, "the cached weight was used, its amax not re-recorded"


def test_calibration_records_amax_in_high_precision(device):
    m = te.Linear(16, 8, device=device)
    x = torch.randn(4, 16, device=device)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling(amax_history_len=2)):
        y = m(x)
    assert torch.equal(y, torch.nn.functional.linear(x, m.weight, m.bias))
    assert torch.equal(m.fp8_meta["scaling_fwd"].scale[0], fp32_quotient(448.0, x.abs().amax()))


def test_state_dict_round_trip_continues_bit_identically(device):
    torch.manual_seed(3)
    r = recipe.DelayedScaling(amax_history_len=4)
    a = te.Linear(32, 16, device=device)
    for _ in range(3):
        with te.autocast(recipe=r):
            y = a(torch.randn(8, 32, device=device))
        y.sum().backward()
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b = te.Linear(32, 16, device=device)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(b.fp8_meta["scaling_fwd"].scale, a.fp8_meta["scaling_fwd"].scale)
    assert torch.equal(b.fp8_meta["scaling_bwd"].amax_history, a.fp8_meta["scaling_bwd"].amax_history)
    x = torch.randn(8, 32, device=device)
    with te.autocast(recipe=r):
        ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)


def test_fp8_activations_are_saved_in_fp8(device):
    m = te.Linear(512, 512, device=device)
    x = torch.randn(256, 512, requires_grad=True, device=device)
    with te.autocast():
        y = m(x)
    linear_node = y.grad_fn  # a 2-D input's output is LinearFunction's own (no view after it)
    assert type(linear_node).__name__ == "LinearFunctionBackward"
    saved = linear_node.saved_tensors
    # only the transposed FP8 input [in, tokens] (for wgrad) is kept, not the fp32 input
    assert any(t.dtype == E4M3 and t.shape == (512, 256) for t in saved)
    assert not any(t.dtype == torch.float32 and t.numel() == 256 * 512 for t in saved)


def _train_mlp(fp8: bool, steps: int = 200, rec=None, device="cpu") -> float:
    """A teacher-student regression: a 3-layer MLP of te.Linear learns a fixed random
    2-layer tanh network from bf16 inputs; returns the mean loss of the last 20 steps."""
    torch.manual_seed(4)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(device)
    with torch.no_grad():  # targets of order one
        teacher[0].weight.mul_(4)
        teacher[2].weight.mul_(8)
    student = torch.nn.Sequential(te.Linear(32, 128, device=device), torch.nn.GELU(),
                                  te.Linear(128, 128, device=device), torch.nn.GELU(), te.Linear(128, 8, device=device))
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        x = torch.randn(256, 32).to(device)
        with torch.no_grad():
            target = teacher(x)
        with te.autocast(enabled=fp8, recipe=rec or recipe.DelayedScaling(amax_history_len=16)):
            y = student(x.to(torch.bfloat16))
        loss = torch.nn.functional.mse_loss(y.float(), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    tail = losses[-20:]
    return sum(tail) / len(tail)


@pytest.mark.parametrize("rec", [None, recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(),
                                 recipe.MXFP8BlockScaling()], ids=["delayed", "current", "block", "mxfp8"])
def test_fp8_training_tracks_bf16(device, rec):
    bf16, fp8 = _train_mlp(fp8=False, device=device), _train_mlp(fp8=True, rec=rec, device=device)
    first = _train_mlp(fp8=False, steps=1, device=device)
    assert bf16 < 0.2 * first, "the task is learnable: bf16 loss drops well below the start"
    assert abs(fp8 - bf16) <= 0.02 * bf16, f"FP8 loss {fp8:.5f} vs bf16 {bf16:.5f}"


def test_compile_fullgraph_high_precision(device):
    m = te.Linear(24, 12, device=device)
    x = torch.randn(5, 24, requires_grad=True, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    y1 = compiled(x)
    y2 = m(x)
    assert torch.equal(y1, y2)


def test_compiled_fp8_linear_matches_eager_step_by_step(device):
    """torch.compile (graph breaks allowed) of an FP8 te.Linear: same outputs, gradients and
    scale updates as eager over several steps."""
    torch.manual_seed(6)
    eager, compiled_src = te.Linear(32, 16, device=device), te.Linear(32, 16, device=device)
    compiled_src.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(compiled_src)
    r = recipe.DelayedScaling(amax_history_len=4)
    for _ in range(3):
        x = torch.randn(8, 32, device=device)
        with te.autocast(recipe=r):
            y1, y2 = eager(x), compiled(x)
        y1.sum().backward(), y2.sum().backward()
        assert torch.equal(y1, y2)
        assert torch.equal(eager.weight.grad, compiled_src.weight.grad)
        assert torch.equal(eager.fp8_meta["scaling_fwd"].scale, compiled_src.fp8_meta["scaling_fwd"].scale)
        assert torch.equal(eager.fp8_meta["scaling_bwd"].scale, compiled_src.fp8_meta["scaling_bwd"].scale)


@pytest.mark.parametrize("shape", [(0, 24), (2, 3, 24)], ids=str)
def test_fp8_zero_tokens_and_3d_input(device, shape):
    m = te.Linear(24, 8, device=device)
    x = torch.randn(shape, requires_grad=True, device=device)
    with te.autocast():
        y = m(x)
    assert y.shape == (*shape[:-1], 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and m.weight.grad.shape == (8, 24)
    if x.numel() == 0:
        assert torch.equal(m.weight.grad, torch.zeros(8, 24, device=device))


@pytest.mark.parametrize("make", [lambda d: te.Linear(16, 8, device=d), lambda d: te.LayerNormLinear(16, 8, device=d),
                                  lambda d: te.LayerNormMLP(16, 32, device=d)],
                         ids=["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("rec", [recipe.DelayedScaling(), recipe.MXFP8BlockScaling()], ids=["delayed", "mxfp8"])
def test_a_forward_reads_the_autocast_state_once(monkeypatch, device, make, rec):
    """The module reads the recipe in force once per forward and hands it on as a value."""
    from transformer_engine.pytorch.module import _fp8_module
    reads = []
    original = _fp8_module.current_context
    monkeypatch.setattr(_fp8_module, "current_context", lambda: reads.append(1) or original())
    module, x = make(device), torch.randn(4, 16, requires_grad=True, device=device)
    with te.autocast(recipe=rec):
        module(x).sum().backward()
    assert len(reads) == 1
