"""te.LayerNormMLP against plain PyTorch (norm + linear + the activation formula written out
+ linear) with copied parameters; checkpoint=True; FP8 under every recipe; the fused
norm/activation -> FP8 path against te.LayerNorm + te.Linear + activation + te.Linear;
TransformerEngine's names, options and errors."""
import math

import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module._fused_fp8 import norm_to_fp8
from transformer_engine.pytorch.module._fp8_call import Fp8Call
from numerics import assert_close, assert_two_reference, assert_value_error_naming, tolerances
from test_layernorm_linear import RECIPE_IDS, RECIPES, assert_fp8_step_close, reference_norm, trained_and_reloaded

ACTIVATIONS = ["gelu", "qgelu", "relu", "srelu", "silu", "glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu",
               "clamped_swiglu"]


def plain_activation(kind, x, limit=7.0, alpha=1.702):
    """TE_API.md section 3, written out in plain PyTorch."""
    def gelu(v):
        return v * (0.5 + 0.5 * torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    fns = {"gelu": gelu, "qgelu": lambda v: v * torch.sigmoid(1.702 * v), "relu": torch.relu,
           "srelu": lambda v: torch.relu(v) ** 2, "silu": lambda v: v * torch.sigmoid(v), "glu": torch.sigmoid}
    if kind in fns and kind != "glu":
        return fns[kind](x)
    a, b = x.chunk(2, dim=-1)
    if kind == "clamped_swiglu":
        a, b = a.clamp(max=limit), b.clamp(-limit, limit) + 1
        return a * torch.sigmoid(alpha * a) * b
    gate = {"glu": "glu", "geglu": "gelu", "qgeglu": "qgelu", "reglu": "relu", "sreglu": "srelu",
            "swiglu": "silu"}[kind]
    return fns[gate](a) * b


def run_reference(m, x, dy, dtype):
    """[y, ln_out, grad_input, grad of every parameter] of m in plain PyTorch in dtype."""
    x = x.detach().to(dtype).requires_grad_()
    p = {name: t.detach().to(dtype).requires_grad_() for name, t in m.named_parameters()}
    ln = reference_norm(x, p["layer_norm_weight"], p.get("layer_norm_bias"), m.normalization, m.eps,
                        m.zero_centered_gamma)
    h = F.linear(ln, p["fc1_weight"], p.get("fc1_bias"))
    y = F.linear(plain_activation(m.activation, h, m.activation_limit, m.activation_alpha), p["fc2_weight"],
                 p.get("fc2_bias"))
    (y.to(dy.dtype) * dy).sum().backward()
    return [y, ln, x.grad] + [p[name].grad for name, _ in m.named_parameters()]


def check_against_reference(m, x, dtype):
    """Output, norm output, input gradient and every parameter gradient of m (dtype) against
    plain PyTorch. fp32: against float64, within fp32's tolerances with atol taken relative
    to the tensor's largest value (these are sums of many products; the activation kernels'
    derivatives round differently from autograd's). bf16: the two-reference rule (error
    versus float64 at most 2x (forward) / 3x (backward) that of plain PyTorch in bf16)."""
    x_ours = x.to(dtype).requires_grad_()
    y, ln_out = m(x_ours)
    dy = torch.randn(y.shape).to(y.device)
    (y.float() * dy).sum().backward()
    ours = [y, ln_out, x_ours.grad] + [p.grad for p in m.parameters()]
    names = ["output", "ln_out", "grad_input"] + [f"grad {n}" for n, _ in m.named_parameters()]
    exact = run_reference(m, x_ours, dy.double(), torch.float64)
    plain = run_reference(m, x_ours, dy, dtype) if dtype != torch.float32 else exact
    for index, (got, want, low, name) in enumerate(zip(ours, exact, plain, names)):
        assert got.dtype == dtype and got.shape == want.shape, name
        if dtype == torch.float32:
            scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
            assert_close(got, want, dtype=dtype, name=name, atol=tolerances(dtype)["atol"] * scale)
        else:
            assert_two_reference(got, low, want, 2 if index < 2 else 3, name=name)


def randomize(m, scale=0.5):
    """Norm parameters and biases away from their init, so that their gradients count."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "weight" not in name or name == "layer_norm_weight":
                p.copy_(torch.randn_like(p) * scale)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_matches_plain_pytorch(device, activation):
    index = ACTIVATIONS.index(activation)  # alternate the norm options over the activations
    m = te.LayerNormMLP(37, 53, activation=activation, normalization=("LayerNorm", "RMSNorm")[index % 2],
                        zero_centered_gamma=index % 3 == 0, return_layernorm_output=True,
                        activation_params={"limit": 1.5, "alpha": 0.8} if activation == "clamped_swiglu" else None,
                        init_method=lambda w: torch.nn.init.normal_(w, 0, 0.3), device=device)
    randomize(m)
    check_against_reference(m, torch.randn(3, 5, 37, device=device) * 2, torch.float32)


@pytest.mark.parametrize("activation,normalization", [("gelu", "LayerNorm"), ("swiglu", "RMSNorm")])
@pytest.mark.parametrize("shape", [(3, 5, 37), (0, 37)], ids=str)
def test_bf16_and_zero_tokens_match_plain_pytorch(device, activation, normalization, shape):
    m = te.LayerNormMLP(37, 53, activation=activation, normalization=normalization, params_dtype=torch.bfloat16,
                        return_layernorm_output=True, init_method=lambda w: torch.nn.init.normal_(w, 0, 0.3),
                        device=device)
    randomize(m)
    check_against_reference(m, torch.randn(shape, device=device) * 2, torch.bfloat16)


def test_non_contiguous_input_and_no_bias(device):
    m = te.LayerNormMLP(16, 24, bias=False, activation="reglu", return_layernorm_output=True, device=device)
    assert m.fc1_bias is None and m.fc2_bias is None
    x = torch.randn(16, 4, 3, device=device).transpose(0, 2)  # [3, 4, 16], not contiguous
    check_against_reference(m, x, torch.float32)


def test_state_dict_names_shapes_and_defaults():
    """CPU only: the default device."""
    m = te.LayerNormMLP(32, 48)
    assert list(m.state_dict()) == ["layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight",
                                    "fc2_bias", "_extra_state"]
    assert [tuple(v.shape) for v in m.parameters()] == [(32,), (32,), (48, 32), (48,), (32, 48), (32,)]
    gated = te.LayerNormMLP(32, 48, normalization="RMSNorm", activation="swiglu", bias=False)
    assert [(k, tuple(v.shape)) for k, v in gated.named_parameters()] == [
        ("layer_norm_weight", (32,)), ("fc1_weight", (96, 32)), ("fc2_weight", (32, 48))]
    assert m.activation == "gelu" and m.eps == 1e-5 and m.fc1_weight.device.type == "cpu"
    big = te.LayerNormMLP(256, 256)
    assert abs(big.fc1_weight.std().item() - 0.023) < 0.003 and abs(big.fc2_weight.std().item() - 0.023) < 0.003
    assert torch.equal(big.fc1_bias, torch.zeros(256)) and torch.equal(big.layer_norm_weight, torch.ones(256))
    custom = te.LayerNormMLP(8, 4, init_method=torch.nn.init.ones_, output_layer_init_method=torch.nn.init.zeros_,
                             zero_centered_gamma=True)
    assert torch.equal(custom.fc1_weight, torch.ones(4, 8)) and torch.equal(custom.fc2_weight, torch.zeros(8, 4))
    assert torch.equal(custom.layer_norm_weight, torch.zeros(8))


def test_return_bias_and_layernorm_output(device):
    m = te.LayerNormMLP(12, 20, return_bias=True, return_layernorm_output=True, device=device)
    with torch.no_grad():
        m.fc2_bias.fill_(2.0)
    x = torch.randn(4, 12, device=device)
    y, bias, ln_out = m(x)
    assert bias is m.fc2_bias
    assert_close(ln_out, F.layer_norm(x, (12,)), name="ln_out")
    want = F.linear(plain_activation("gelu", F.linear(ln_out, m.fc1_weight, m.fc1_bias)), m.fc2_weight)
    assert_close(y, want, name="output without fc2_bias")
    y2, bias2 = te.LayerNormMLP(12, 20, return_bias=True, device=device)(x)
    assert y2.shape == (4, 12) and bias2.shape == (12,)


def saved_bytes(m, x, **autocast):
    """(output, bytes autograd saves for backward during m's forward)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), te.autocast(**autocast):
        y = m(x)
    return y, total[0]


@pytest.mark.parametrize("rec", [None, recipe.DelayedScaling(amax_history_len=4), recipe.MXFP8BlockScaling()],
                         ids=["high-precision", "delayed", "mxfp8"])
def test_checkpoint_recomputes_with_identical_gradients_and_saves_less(device, rec):
    plain = te.LayerNormMLP(64, 96, activation="geglu", device=device)
    ckpt = te.LayerNormMLP(64, 96, activation="geglu", checkpoint=True, device=device)
    ckpt.load_state_dict(plain.state_dict())
    autocast = {"enabled": rec is not None, "recipe": rec}
    for step in range(2):  # the second step runs on updated scales
        x = torch.randn(2, 16, 64, device=device) * (1 + step)
        dy = torch.randn_like(x)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y1, bytes_plain = saved_bytes(plain, x1, **autocast)
        y2, bytes_ckpt = saved_bytes(ckpt, x2, **autocast)
        assert bytes_ckpt < bytes_plain / 2, (bytes_ckpt, bytes_plain)
        y1.backward(dy), y2.backward(dy)
        assert torch.equal(y1, y2) and torch.equal(x1.grad, x2.grad), step
        for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
            assert torch.equal(a.grad, b.grad), (step, name)
        if rec is not None:
            for direction in ("scaling_fwd", "scaling_bwd"):
                assert torch.equal(plain.fp8_meta[direction].amax_history, ckpt.fp8_meta[direction].amax_history)
                assert torch.equal(plain.fp8_meta[direction].scale, ckpt.fp8_meta[direction].scale)


def test_fuse_wgrad_accumulation_and_delay_wgrad_compute(device):
    m = te.LayerNormMLP(10, 14, fuse_wgrad_accumulation=True, device=device)
    m.fc1_weight.main_grad = torch.zeros(14, 10, device=device)
    m.fc2_weight.main_grad = torch.ones(10, 14, device=device)
    reference = te.LayerNormMLP(10, 14, device=device)
    reference.load_state_dict(m.state_dict())
    x, dy = torch.randn(4, 10, device=device), torch.randn(4, 10, device=device)
    m(x).backward(dy)
    reference(x).backward(dy)
    assert m.fc1_weight.grad is None and m.fc2_weight.grad is None
    assert_close(m.fc1_weight.main_grad, reference.fc1_weight.grad, name="fc1 main_grad")
    assert_close(m.fc2_weight.main_grad, 1 + reference.fc2_weight.grad, name="fc2 main_grad")
    with pytest.raises(ValueError, match="fc1_weight.main_grad"):
        te.LayerNormMLP(10, 14, fuse_wgrad_accumulation=True, device=device)(x)
    delayed = te.LayerNormMLP(10, 14, delay_wgrad_compute=True, device=device)
    delayed.load_state_dict(reference.state_dict())
    delayed(x).backward(dy)
    assert delayed.fc1_weight.grad is None and delayed.fc2_bias.grad is None
    delayed.backward_dw()
    for name in ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "layer_norm_weight"):
        assert torch.equal(getattr(delayed, name).grad, getattr(reference, name).grad), name


def test_meta_device_then_reset(device):
    m = te.LayerNormMLP(16, 8, device="meta", activation="swiglu")
    assert m.fc1_weight.is_meta and m.fc1_weight.shape == (16, 16)
    m = m.to_empty(device=device)
    m.reset_parameters()
    assert torch.equal(m.fc2_bias, torch.zeros(16, device=device))
    assert torch.equal(m.layer_norm_weight, torch.ones(16, device=device))
    assert m.fc1_weight.std() > 0 and m.fc2_weight.std() > 0


def test_bad_arguments(device):
    assert_value_error_naming(lambda: te.LayerNormMLP(8, 4, activation="tanh", device=device),
                              ["tanh", *ACTIVATIONS])
    assert_value_error_naming(lambda: te.LayerNormMLP(8, 4, normalization="GroupNorm", device=device),
                              ["normalization", "GroupNorm"])
    assert_value_error_naming(lambda: te.LayerNormMLP(8, 4, device=device)(torch.randn(2, 3, 9, device=device)),
                              ["(2, 3, 9)", "hidden_size=8"])
    assert_value_error_naming(lambda: te.LayerNormMLP(8, 4, activation_params={"limit": 2.0}, device=device),
                              ["activation_params", "clamped_swiglu", "gelu"])
    assert_value_error_naming(lambda: te.LayerNormMLP(8, 4, activation="clamped_swiglu",
                                                      activation_params={"beta": 1.0}, device=device),
                              ["beta", "limit", "alpha"])
    split = te.LayerNormMLP(8, 4, tp_size=2, set_parallel_mode=True, device=device)  # this rank's ffn share
    assert split.fc1_weight.shape == (2, 8) and split.fc2_weight.shape == (8, 2)
    with pytest.raises(RuntimeError, match="tp_size=2 needs torch.distributed"):
        split(torch.randn(3, 8, device=device))
    assert_value_error_naming(lambda: te.LayerNormMLP(8, 3, tp_size=2, set_parallel_mode=True, device=device),
                              ["ffn_hidden_size=3", "2 tensor-parallel ranks"])
    te.LayerNormMLP(8, 4, set_parallel_mode=True, seq_length=4, micro_batch_size=2, device=device)  # one rank: accepted


def test_compile_fullgraph_equals_eager(device):
    m = te.LayerNormMLP(24, 40, activation="swiglu", normalization="RMSNorm", device=device)
    x1 = torch.randn(2, 5, 24, requires_grad=True, device=device)
    x2 = x1.detach().clone().requires_grad_()
    torch._dynamo.reset()
    y1 = torch.compile(m, fullgraph=True)(x1)
    y1.sum().backward()
    grads1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    y2 = m(x2)
    y2.sum().backward()
    assert torch.equal(y1, y2) and torch.equal(x1.grad, x2.grad)
    for a, (name, p) in zip(grads1, m.named_parameters()):  # compiled reductions may round differently
        assert_close(a, p.grad, name=name)


# --- FP8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
def test_fp8_forward_backward_close_to_high_precision(device, rec):
    assert_fp8_step_close(te.LayerNormMLP(256, 384, activation="swiglu", device=device), rec, grad_floor_db=10)


class OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The names of the dispatcher ops run inside it, and the shape of each one's (first) output."""

    def __init__(self):
        super().__init__()
        self.names, self.shapes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        self.names.append(func._schema.name)
        self.shapes.append(tuple(first.shape) if isinstance(first, torch.Tensor) else None)
        return out


@pytest.mark.parametrize("activation,normalization", [("gelu", "LayerNorm"), ("swiglu", "RMSNorm")])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_fp8_equals_the_composition_and_slots_follow_te_order(device, activation, normalization, bias, dtype):
    """Delayed scaling: the fused norm -> FP8 and activation -> FP8 kernels, and without an fc1
    bias the activation's backward -> FP8 gradient codes and their transpose for fc1's backward
    GEMMs, give, step after step, what te.LayerNorm / te.RMSNorm, te.Linear, the activation op
    and te.Linear give, bit for bit; the module's fp8_meta slots hold what the two Linears'
    do, in TransformerEngine's order."""
    torch.manual_seed(11)
    factory = {"device": device, "params_dtype": dtype, "bias": bias}
    m = te.LayerNormMLP(40, 24, activation=activation, normalization=normalization, **factory)
    norm = (te.LayerNorm if normalization == "LayerNorm" else te.RMSNorm)(40, device=device, params_dtype=dtype)
    fc1, fc2 = te.Linear(40, m.fc1_weight.shape[0], **factory), te.Linear(24, 40, **factory)
    randomize(m)
    state = m.state_dict()
    norm.load_state_dict({k[len("layer_norm_"):]: v for k, v in state.items() if k.startswith("layer_norm")})
    fc1.load_state_dict({name: state[f"fc1_{name}"] for name in ("weight", "bias") if f"fc1_{name}" in state})
    fc2.load_state_dict({name: state[f"fc2_{name}"] for name in ("weight", "bias") if f"fc2_{name}" in state})
    r = recipe.DelayedScaling(amax_history_len=4, margin=1)
    for step in range(3):
        x = (torch.randn(6, 40, device=device) * (1 + step)).to(dtype)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        with te.autocast(recipe=r):
            y1 = m(x1)
            y2 = fc2(te.kernels.activation(fc1(norm(x2)), activation))
        dy = torch.randn_like(y1)
        with OpLog() as log:
            y1.backward(dy)
        y2.backward(dy)
        fused_backward = "portable_te::activation_bwd_fp8" in log.names
        assert fused_backward == (not bias) and ("portable_te::activation_bwd" in log.names) == bias, log.names
        assert torch.equal(y1, y2) and torch.equal(x1.grad, x2.grad), step
        pairs = [("layer_norm_weight", norm.weight), ("fc1_weight", fc1.weight), ("fc1_bias", fc1.bias),
                 ("fc2_weight", fc2.weight), ("fc2_bias", fc2.bias)]
        for name, other in pairs:
            if getattr(m, name) is not None:
                assert torch.equal(getattr(m, name).grad, other.grad), (step, name)
        for direction, width in (("scaling_fwd", 3), ("scaling_bwd", 2)):
            ours = m.fp8_meta[direction]
            for index, linear in enumerate((fc1, fc2)):
                theirs = linear.fp8_meta[direction]
                columns = slice(index * width, (index + 1) * width)
                assert torch.equal(ours.amax_history[:, columns], theirs.amax_history), (step, direction, index)
                assert torch.equal(ours.scale[columns], theirs.scale), (step, direction, index)
        for p in (*m.parameters(), *norm.parameters(), *fc1.parameters(), *fc2.parameters()):
            p.grad = None


def test_calibration_records_each_gemm_input_in_its_slot(device):
    m = te.LayerNormMLP(32, 48, activation="srelu", device=device)
    x = torch.randn(8, 32, device=device) * 2
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling(amax_history_len=2)):
        y = m(x)
    ln = F.layer_norm(x, (32,))
    act = plain_activation("srelu", F.linear(ln, m.fc1_weight, m.fc1_bias))
    assert_close(y, F.linear(act, m.fc2_weight, m.fc2_bias), name="high-precision output")
    live = m.fp8_meta["scaling_fwd"].amax_history[-1]  # the step's amaxes, rolled to the last row
    assert_close(live[0], ln.abs().max(), name="fc1 input amax")
    assert torch.equal(live[1], m.fc1_weight.detach().abs().max())
    assert_close(live[3], act.abs().max(), name="fc2 input amax = max |activation output|")
    assert torch.equal(live[4], m.fc2_weight.detach().abs().max())
    assert m.fp8_meta["scaling_bwd"].amax_history.shape == (2, 4)


def test_fp8_state_dict_round_trip_and_microbatch_cache(device):
    r = recipe.DelayedScaling(amax_history_len=4)
    a, b = trained_and_reloaded(lambda: te.LayerNormMLP(32, 16, activation="qgeglu", device=device), r)
    for direction in ("scaling_fwd", "scaling_bwd"):
        assert torch.equal(b.fp8_meta[direction].scale, a.fp8_meta[direction].scale)
        assert torch.equal(b.fp8_meta[direction].amax_history, a.fp8_meta[direction].amax_history)
    x = torch.randn(8, 32, device=device)
    with te.autocast(recipe=r):
        ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)
    weight_amaxes = a.fp8_meta["scaling_fwd"].amax_history[:, [1, 4]].amax(dim=0)
    with torch.no_grad():
        a.fc1_weight.mul_(100), a.fc2_weight.mul_(100)  # would change the weight amaxes if cast again
    with te.autocast(recipe=r):
        a(x, is_first_microbatch=False)
    assert torch.equal(a.fp8_meta["scaling_fwd"].amax_history[:, [1, 4]].amax(dim=0), weight_amaxes)
    fresh = te.LayerNormMLP(32, 16, activation="qgeglu", device=device)
    fresh.load_state_dict({k: v for k, v in a.state_dict().items() if k != "_extra_state"})  # no FP8 state
    assert fresh.fp8_meta is None


@pytest.mark.parametrize("delayed", [True, False], ids=["delayed", "current"])
def test_fused_producers_hand_their_fp8_codes_to_the_gemm(device, delayed):
    """Under delayed scaling the norm and the activation write the GEMMs' FP8 inputs (one pass
    each), and the GEMMs use those codes instead of casting again: no FP8 cast of an input runs.
    The producers return the GEMM's call with the operand; the module's own calls are not
    written into. Other recipes cast the high-precision outputs."""
    r = recipe.DelayedScaling() if delayed else recipe.Float8CurrentScaling()
    m = te.LayerNormMLP(32, 48, activation="gelu", device=device)
    x = torch.randn(8, 32, requires_grad=True, device=device)
    with te.autocast(recipe=r), OpLog() as log:
        y = m(x)
    y.sum().backward()
    ops = [name.split("::")[-1] for name in log.names]
    assert ("layernorm_fp8_fwd" in ops) == delayed and ("activation_fp8" in ops) == delayed
    casts = sum(ops.count(name) for name in ("fp8_quantize", "fp8_quantize_transpose"))
    assert casts == (2 if delayed else 4)  # the two weights; and the two GEMM inputs unless produced in FP8
    with te.autocast(recipe=recipe.DelayedScaling()):
        call = m._fp8_calls(m._fp8_context(), (m.fc1_weight, m.fc2_weight), None, True)[0]
    assert isinstance(call, Fp8Call) and call.input_fp8 is None
    _, gemm_call = norm_to_fp8(x.detach(), m.layer_norm_weight, m.layer_norm_bias, False, 1e-5, False, call, False)
    assert gemm_call is not call and call.input_fp8 is None
    assert gemm_call.input_fp8 is not None and gemm_call.input_fp8.shape == (8, 32)


def test_fused_producers_backward_makes_no_zero_gradients_for_their_codes(device):
    """The FP8 codes the norm and the activation hand to the GEMMs get no gradient: autograd
    leaves theirs None rather than filling zeros of the codes' size for each backward."""
    m = te.LayerNormMLP(32, 48, activation="gelu", device=device)
    x = torch.randn(8, 32, requires_grad=True, device=device)
    with te.autocast(recipe=recipe.DelayedScaling()):
        y = m(x)
    with OpLog() as log:
        y.sum().backward()
    zeros = [shape for name, shape in zip(log.names, log.shapes)
             if name in ("aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_")]
    assert (8, 32) not in zeros and (8, 48) not in zeros, zeros
    assert x.grad is not None and m.fc1_weight.grad is not None and m.layer_norm_weight.grad is not None
