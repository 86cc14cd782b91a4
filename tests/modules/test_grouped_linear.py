"""te.GroupedLinear, te.Fp8Padding, te.Fp8Unpadding: against a plain-PyTorch loop over the
splits with copied weights; FP8 under every recipe (per-split slots, SQNR); checkpoints;
TE's options; bad arguments."""
import contextlib
import io

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8 import extra_state_codec
from numerics import assert_close, assert_value_error_naming, fp32_quotient, sqnr_db

RECIPES = [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(),
           recipe.MXFP8BlockScaling()]
RECIPE_IDS = ["delayed", "current", "block", "mxfp8"]


def plain_grouped(x, m_splits, weights, biases):
    """The oracle: one torch.nn.functional.linear per row block."""
    blocks = torch.split(x.reshape(-1, x.shape[-1]), m_splits)
    out = torch.cat([torch.nn.functional.linear(b, w, bias) for b, w, bias in zip(blocks, weights, biases)])
    return out.reshape(*x.shape[:-1], weights[0].shape[0])


def copied_params(m):
    """Leaf copies of the module's weights and biases, for the oracle."""
    n = m.num_gemms
    weights = [getattr(m, f"weight{i}").detach().clone().requires_grad_() for i in range(n)]
    biases = [getattr(m, f"bias{i}").detach().clone().requires_grad_() for i in range(n)]
    return weights, biases


def non_contiguous(rows, features, dtype, device):
    """A [rows, features] view whose rows are not contiguous in memory."""
    return torch.randn(features, rows, dtype=dtype, device=device).t()


CASES = {  # name: (input maker, m_splits)
    "odd_with_zeros": (lambda dtype, device: torch.randn(23, 37, dtype=dtype, device=device), [5, 0, 11, 7]),
    "all_zero": (lambda dtype, device: torch.randn(0, 37, dtype=dtype, device=device), [0, 0, 0, 0]),
    "non_contiguous": (lambda dtype, device: non_contiguous(19, 37, dtype, device), [0, 9, 1, 9]),
    "3d": (lambda dtype, device: torch.randn(3, 5, 37, dtype=dtype, device=device), [6, 6, 0, 3]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_plain_loop(device, dtype, case):
    torch.manual_seed(0)
    make, m_splits = CASES[case]
    m = te.GroupedLinear(4, 37, 13, params_dtype=dtype, device=device)
    with torch.no_grad():
        for i in range(4):
            getattr(m, f"bias{i}").normal_()
    weights, biases = copied_params(m)
    x = make(dtype, device)
    dy = torch.randn(*x.shape[:-1], 13, dtype=dtype, device=device)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = m(x1, m_splits), plain_grouped(x2, m_splits, weights, biases)
    y1.backward(dy), y2.backward(dy)
    tol = {} if dtype == torch.float32 else {"atol": 1e-2}
    assert_close(y1, y2, name="output", **tol)
    assert_close(x1.grad, x2.grad, name="grad_input", **tol)
    for i in range(4):
        assert_close(getattr(m, f"weight{i}").grad, weights[i].grad, name=f"grad_weight{i}", **tol)
        assert_close(getattr(m, f"bias{i}").grad, biases[i].grad, name=f"grad_bias{i}", **tol)
        if m_splits[i] == 0:  # an empty split's parameters get zero gradients, not None
            assert not getattr(m, f"weight{i}").grad.any()


def test_defaults_names_and_init():
    """CPU only: the default device."""
    m = te.GroupedLinear(3, 64, 128)
    assert set(m.state_dict()) == {"weight0", "weight1", "weight2", "bias0", "bias1", "bias2", "_extra_state"}
    for i in range(3):
        weight, bias = getattr(m, f"weight{i}"), getattr(m, f"bias{i}")
        assert weight.shape == (128, 64) and weight.device.type == "cpu" and weight.dtype == torch.float32
        assert abs(weight.std().item() - 0.023) < 0.003 and torch.equal(bias, torch.zeros(128))
    assert not torch.equal(m.weight0, m.weight1), "every weight drawn separately"
    no_bias = te.GroupedLinear(2, 8, 4, bias=False, params_dtype=torch.bfloat16)
    assert no_bias.bias0 is None and set(no_bias.state_dict()) == {"weight0", "weight1", "_extra_state"}
    assert no_bias.weight1.dtype == torch.bfloat16
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    assert torch.equal(no_bias(x, [2, 3]), plain_grouped(x, [2, 3], [no_bias.weight0, no_bias.weight1], [None, None]))


@pytest.mark.parametrize("rec", [None, *RECIPES], ids=["none", *RECIPE_IDS])
def test_use_grouped_tensor_runs_the_per_group_gemms(rec):
    """TE main's use_grouped_tensor: the native grouped-tensor path is not offered (its
    predicate says False for every recipe and dtype), and the module computes what it computes
    without the option, bit for bit."""
    from transformer_engine.pytorch.module import is_module_grouped_tensor_path_supported
    assert not is_module_grouped_tensor_path_supported(rec, torch.bfloat16)
    torch.manual_seed(3)
    plain = te.GroupedLinear(2, 32, 32, params_dtype=torch.bfloat16)
    grouped = te.GroupedLinear(2, 32, 32, params_dtype=torch.bfloat16, use_grouped_tensor=True)
    grouped.load_state_dict(plain.state_dict())
    assert grouped.use_grouped_tensor and not plain.use_grouped_tensor
    x = torch.randn(48, 32, dtype=torch.bfloat16)
    with te.autocast(enabled=rec is not None, recipe=rec):
        assert torch.equal(grouped(x, [16, 32]), plain(x, [16, 32]))
    with pytest.raises(TypeError, match="use_grouped_tensor must be a bool or None, got int"):
        te.GroupedLinear(2, 32, 32, use_grouped_tensor=1)


def test_return_bias_returns_the_unadded_biases(device):
    m = te.GroupedLinear(2, 8, 4, return_bias=True, device=device)
    with torch.no_grad():
        m.bias0.fill_(3.0), m.bias1.fill_(-1.0)
    x = torch.randn(5, 8, device=device)
    y, biases = m(x, [3, 2])
    assert isinstance(biases, list) and biases[0] is m.bias0 and biases[1] is m.bias1
    assert_close(y, plain_grouped(x, [3, 2], [m.weight0, m.weight1], [None, None]), name="output")
    _, cast = m(x.bfloat16(), [3, 2])  # TE returns them in the activation dtype
    assert cast[0].dtype == torch.bfloat16


def test_fuse_wgrad_accumulation_uses_main_grad(device):
    m = te.GroupedLinear(2, 5, 3, fuse_wgrad_accumulation=True, device=device)
    m.weight0.main_grad, m.weight1.main_grad = torch.ones(3, 5, device=device), torch.zeros(3, 5, device=device)
    x, dy = torch.randn(4, 5, device=device), torch.randn(4, 3, device=device)
    m(x, [1, 3]).backward(dy)
    assert m.weight0.grad is None and m.weight1.grad is None
    assert_close(m.weight0.main_grad, 1 + dy[:1].t() @ x[:1], name="main_grad0")
    assert_close(m.weight1.main_grad, dy[1:].t() @ x[1:], name="main_grad1")
    assert_close(m.bias1.grad, dy[1:].sum(0), name="grad_bias1")
    del m.weight1.main_grad
    assert_value_error_naming(lambda: m(x, [1, 3]), ["main_grad", "weight1"])


@pytest.mark.parametrize("rec", [None, recipe.Float8CurrentScaling()], ids=["high_precision", "fp8"])
def test_delay_wgrad_compute_defers_weight_gradients_to_backward_dw(device, rec):
    torch.manual_seed(5)
    eager = te.GroupedLinear(2, 12, 6, device=device)
    delayed = te.GroupedLinear(2, 12, 6, delay_wgrad_compute=True, device=device)
    delayed.load_state_dict(eager.state_dict())
    xs = [torch.randn(9, 12, device=device) for _ in range(2)]
    grads_x = []
    for m in (eager, delayed):
        for x in xs:
            xr = x.clone().requires_grad_()
            with te.autocast(enabled=rec is not None, recipe=rec):
                y = m(xr, [4, 5])
            y.square().sum().backward()
            grads_x.append(xr.grad)
    assert delayed.weight0.grad is None and delayed.bias1.grad is None, "nothing until backward_dw()"
    delayed.backward_dw()
    assert torch.equal(grads_x[0], grads_x[2]) and torch.equal(grads_x[1], grads_x[3])
    for name in ("weight0", "weight1", "bias0", "bias1"):
        assert torch.equal(getattr(delayed, name).grad, getattr(eager, name).grad), name
    delayed.backward_dw()  # nothing pending: no change
    assert torch.equal(delayed.weight0.grad, eager.weight0.grad)


def test_meta_device_then_reset(device):
    m = te.GroupedLinear(2, 16, 8, device="meta")
    assert m.weight0.is_meta and m.bias1.is_meta
    m = m.to_empty(device=device)
    m.reset_parameters()
    assert torch.equal(m.bias1, torch.zeros(8, device=device)) and m.weight0.std() > 0 and m.weight1.std() > 0


def test_rng_tracker_fork_wraps_the_initialisation():
    """CPU only: which RNG fork the initialisation runs under (no computation)."""
    forks = []

    class Tracker:
        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            forks.append(name)
            yield

    te.GroupedLinear(2, 4, 4, get_rng_state_tracker=Tracker, rng_tracker_name="expert-rng")
    te.GroupedLinear(1, 4, 4, get_rng_state_tracker=Tracker)
    assert forks == ["expert-rng", "expert-rng", "model-parallel-rng"]


def test_errors_and_refusals(device):
    m = te.GroupedLinear(3, 8, 2, device=device)
    x = torch.randn(6, 8, device=device)
    assert_value_error_naming(lambda: m(x, [3, 3]), ["m_splits", "2 entries", "num_gemms=3"])
    assert_value_error_naming(lambda: m(x, [4, 4, -2]), ["m_splits", "[4, 4, -2]", "negative"])
    assert_value_error_naming(lambda: m(x, [1, 2, 4]), ["m_splits", "add up to 7", "6 rows"])
    assert_value_error_naming(lambda: m(torch.randn(6, 7, device=device), [2, 2, 2]), ["(6, 7)", "in_features=8"])
    assert_value_error_naming(lambda: te.GroupedLinear(0, 8, 2, device=device), ["num_gemms", "0"])
    assert_value_error_naming(lambda: te.GroupedLinear(2, 8, 2, tp_size=2, parallel_mode="row", device=device),
                              ["bias=True", "tp_size=2"])
    column = te.GroupedLinear(2, 8, 4, tp_size=2, parallel_mode="column", bias=False, device=device)
    assert column.weight0.shape == (2, 8) and column.out_features == 2 and column.weight1.partition_dim == 0
    row = te.GroupedLinear(2, 8, 4, tp_size=2, parallel_mode="row", bias=False, device=device)
    assert row.weight0.shape == (4, 4) and row.weight0.partition_dim == 1
    assert row(torch.randn(5, 4, device=device), [2, 3]).shape == (5, 4)  # no exchange: the MoE layer's
    assert_value_error_naming(lambda: te.GroupedLinear(2, 8, 2, parallel_mode="diagonal", device=device),
                              ["parallel_mode", "diagonal"])
    # Megatron's call, one rank
    one_rank = te.GroupedLinear(2, 8, 2, parallel_mode="row", sequence_parallel=True, device=device)
    assert torch.equal(one_rank(x, [2, 4]), plain_grouped(x, [2, 4], [one_rank.weight0, one_rank.weight1],
                                                         [one_rank.bias0, one_rank.bias1]))
    assert_value_error_naming(lambda: te.Fp8Padding(2)(x, [5]), ["Fp8Padding", "m_splits", "num_gemms=2"])
    assert_value_error_naming(lambda: te.Fp8Padding(2)(x, [5, 5]), ["add up to 10", "6 rows"])
    assert_value_error_naming(lambda: te.Fp8Unpadding(2, align_size=4)(x, [3, 3]),
                              ["Fp8Unpadding", "[4, 4]", "8 rows", "6 rows"])
    assert_value_error_naming(lambda: te.Fp8Padding(2, align_size=0), ["align_size", "0"])


def test_compile_fullgraph_equals_eager(device):
    torch.manual_seed(7)
    m = te.GroupedLinear(3, 24, 12, device=device)
    x = torch.randn(11, 24, device=device)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    y1 = compiled(x1, [4, 0, 7])
    y1.sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    y2 = m(x2, [4, 0, 7])
    y2.sum().backward()
    assert torch.equal(y1, y2) and torch.equal(x1.grad, x2.grad)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, m.parameters()))


# --- FP8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
def test_fp8_every_recipe_close_to_high_precision(device, rec):
    torch.manual_seed(2)
    m = te.GroupedLinear(3, 256, 128, device=device)
    weights, biases = copied_params(m)
    m_splits = [40, 0, 57]  # odd sizes: neither a multiple of 16 nor of a block
    x = torch.randn(97, 256, device=device)
    dy = torch.randn(97, 128, device=device)
    xr = x.clone().requires_grad_()
    exact = plain_grouped(xr, m_splits, weights, biases)
    exact.backward(dy)
    for _ in range(2):  # delayed scaling needs one step to learn its scales
        m.zero_grad()
        x8 = x.clone().requires_grad_()
        with te.autocast(recipe=rec):
            y = m(x8, m_splits)
        y.backward(dy)
    assert torch.isfinite(y).all() and torch.isfinite(x8.grad).all()
    assert sqnr_db(exact, y) >= 18
    assert sqnr_db(xr.grad, x8.grad) >= 20
    for i in (0, 2):
        assert sqnr_db(weights[i].grad, getattr(m, f"weight{i}").grad) >= 20, i
        assert_close(getattr(m, f"bias{i}").grad, biases[i].grad, name=f"grad_bias{i}")
    assert not m.weight1.grad.any() and not m.bias1.grad.any()


@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
def test_fp8_each_split_equals_te_linear_on_its_rows(device, rec):
    """Split i casts like a te.Linear holding weight{i}: the same scales, the same blocks
    for its role (split 1's input sits in slot 1, a weight slot of a Linear's layout)."""
    torch.manual_seed(11)
    m = te.GroupedLinear(3, 64, 32, device=device)
    m_splits = [6, 9, 0]
    # rows of very different sizes: per-row blocks matter
    row_scales = 2.0 ** torch.arange(-4, 11, device=device)[:, None]
    x, dy = torch.randn(15, 64, device=device) * row_scales, torch.randn(15, 32, device=device)
    x1 = x.clone().requires_grad_()
    with te.autocast(recipe=rec):
        y = m(x1, m_splits)
    y.backward(dy)
    start = 0
    for i, rows in enumerate(m_splits):
        linear = te.Linear(64, 32, device=device)
        linear.load_state_dict({"weight": getattr(m, f"weight{i}").detach(), "bias": getattr(m, f"bias{i}").detach()},
                               strict=False)
        xi = x[start:start + rows].clone().requires_grad_()
        with te.autocast(recipe=rec):
            yi = linear(xi)
        yi.backward(dy[start:start + rows])
        assert_close(y[start:start + rows], yi, name=f"output of split {i}")
        assert_close(x1.grad[start:start + rows], xi.grad, name=f"grad_input of split {i}")
        assert_close(getattr(m, f"weight{i}").grad, linear.weight.grad, name=f"grad_weight{i}")
        start += rows


def test_fp8_per_split_slots_current_scaling(device):
    """Each split's input, weight and gradient land in their own slots (inputs 0..n-1,
    weights n..2n-1, grad outputs 0..n-1); the empty split leaves its slots alone."""
    torch.manual_seed(3)
    m = te.GroupedLinear(3, 16, 8, device=device)
    m_splits = [5, 0, 3]
    weight_amaxes = [getattr(m, f"weight{i}").detach().abs().max() for i in range(3)]
    # distinct amaxes per split
    x = torch.randn(8, 16, device=device) * torch.tensor([1.0] * 5 + [7.0] * 3, device=device)[:, None]
    dy = torch.randn(8, 8, device=device) * torch.tensor([0.01] * 5 + [20.0] * 3, device=device)[:, None]
    xr = x.clone().requires_grad_()
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = m(xr, m_splits)
    y.backward(dy)
    fwd, bwd = m.fp8_meta["scaling_fwd"], m.fp8_meta["scaling_bwd"]
    assert fwd.amax_history.shape == (1, 9) and bwd.amax_history.shape == (1, 6)
    want_fwd = [x[:5].abs().max(), 0.0, x[5:].abs().max(), *weight_amaxes, 0.0, 0.0, 0.0]
    assert torch.equal(fwd.amax_history[0], torch.tensor([float(v) for v in want_fwd], device=device))
    assert torch.equal(bwd.amax_history[0], torch.tensor([float(dy[:5].abs().max()), 0, float(dy[5:].abs().max()),
                                                          0, 0, 0], device=device))
    one = torch.tensor(1.0, device=device)
    assert torch.equal(fwd.scale[1], one) and torch.equal(bwd.scale[1], one)
    assert torch.equal(fwd.scale[0], fp32_quotient(448.0, fwd.amax_history[0, 0]))


def test_fp8_per_split_slots_delayed_scaling_and_empty_steps(device):
    torch.manual_seed(4)
    r = recipe.DelayedScaling(amax_history_len=4)
    m = te.GroupedLinear(2, 16, 8, device=device)
    x = torch.randn(6, 16, requires_grad=True, device=device)
    with te.autocast(recipe=r):
        y = m(x, [0, 6])
    y.sum().backward()
    fwd, bwd = m.fp8_meta["scaling_fwd"], m.fp8_meta["scaling_bwd"]
    last = fwd.amax_history[-1]  # the update rolled the step's amaxes to the last row
    assert last[0] == 0 and last[1] == x.abs().max() and last[2] == m.weight0.abs().max()
    assert last[3] == m.weight1.abs().max() and bwd.amax_history[-1, 0] == 0 and bwd.amax_history[-1, 1] == 1
    assert torch.equal(fwd.scale[0], torch.tensor(1.0, device=device)), "no amax yet: the scale stays"
    assert torch.isfinite(fwd.scale).all() and torch.isfinite(bwd.scale).all()
    with te.autocast(recipe=r):  # every split empty: nothing cast, scales unchanged and finite
        y = m(torch.randn(0, 16, requires_grad=True, device=device), [0, 0])
    y.sum().backward()
    assert torch.isfinite(fwd.scale).all()
    assert torch.equal(fwd.scale[2], fp32_quotient(448.0, m.weight0.detach().abs().max()))


def test_fp8_is_first_microbatch_caches_the_weights(device):
    m = te.GroupedLinear(2, 16, 8, device=device)
    r = recipe.DelayedScaling(amax_history_len=4)
    x = torch.randn(6, 16, device=device)
    with te.autocast(recipe=r):
        y1 = m(x, [2, 4], is_first_microbatch=True)
    with torch.no_grad():
        m.weight0.mul_(100), m.weight1.mul_(100)  # would change the weight amaxes if they were re-cast
    with te.autocast(recipe=r):
        y2 = m(x, [2, 4], is_first_microbatch=False)
    history = m.fp8_meta["scaling_fwd"].amax_history
    assert history[:, 2:4].max() < 1.0, "the cached weights were used, their amaxes not re-recorded"
    assert_close(y1, y2, name="output from cached weights", atol=0.1)


def test_calibration_records_amax_in_high_precision(device):
    m = te.GroupedLinear(2, 16, 8, device=device)
    x = torch.randn(7, 16, device=device)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling(amax_history_len=2)):
        y = m(x, [7, 0])
    assert torch.equal(y, plain_grouped(x, [7, 0], [m.weight0, m.weight1], [m.bias0, m.bias1]))
    assert torch.equal(m.fp8_meta["scaling_fwd"].scale[0], fp32_quotient(448.0, x.abs().amax()))
    assert torch.equal(m.fp8_meta["scaling_fwd"].scale[1], torch.tensor(1.0, device=device)), \
        "empty split: nothing recorded"


@pytest.mark.parametrize("rec", [recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()], ids=["current", "mxfp8"])
def test_save_original_input_gives_the_same_gradients(device, rec):
    torch.manual_seed(8)
    a = te.GroupedLinear(2, 64, 32, device=device)
    b = te.GroupedLinear(2, 64, 32, save_original_input=True, device=device)
    b.load_state_dict(a.state_dict())
    x = torch.randn(40, 64, device=device)
    for m in (a, b):
        with te.autocast(recipe=rec):
            m(x.clone().requires_grad_(), [17, 23]).sum().backward()
    assert torch.equal(a.weight0.grad, b.weight0.grad) and torch.equal(a.weight1.grad, b.weight1.grad)
    with pytest.raises(ValueError, match="save_original_input.*DelayedScaling"), \
            te.autocast(recipe=recipe.DelayedScaling()):
        b(x, [17, 23])


def test_fp8_weights_from_quantized_model_init(device):
    rec = recipe.Float8CurrentScaling()
    with te.quantized_model_init(recipe=rec):
        stored = te.GroupedLinear(2, 32, 16, device=device)
    assert isinstance(stored.weight0, te.QuantizedTensor)
    plain = te.GroupedLinear(2, 32, 16, device=device)
    with torch.no_grad():
        for i in range(2):
            getattr(plain, f"weight{i}").copy_(getattr(stored, f"weight{i}").dequantize())
    x = torch.randn(9, 32, device=device)
    with te.autocast(recipe=rec):
        assert torch.equal(stored(x, [4, 5]), plain(x, [4, 5]))


def test_state_dict_round_trip_continues_bit_identically(device):
    torch.manual_seed(9)
    r = recipe.DelayedScaling(amax_history_len=4)
    a = te.GroupedLinear(3, 32, 16, device=device)
    for _ in range(3):
        with te.autocast(recipe=r):
            y = a(torch.randn(12, 32, device=device), [5, 0, 7])
        y.sum().backward()
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert extra_state_codec.decode(state["_extra_state"])["amax_history_fwd"].shape == (4, 9)
    b = te.GroupedLinear(3, 32, 16, device=device)
    b.load_state_dict(state)
    assert torch.equal(b.fp8_meta["scaling_fwd"].scale, a.fp8_meta["scaling_fwd"].scale)
    assert torch.equal(b.fp8_meta["scaling_bwd"].amax_history, a.fp8_meta["scaling_bwd"].amax_history)
    x = torch.randn(12, 32, device=device)
    with te.autocast(recipe=r):
        assert torch.equal(a(x, [5, 0, 7]), b(x, [5, 0, 7]))
    plain = {k: v for k, v in state.items() if k != "_extra_state"}
    c = te.GroupedLinear(3, 32, 16, device=device)
    c.load_state_dict(plain)  # strict: a checkpoint without FP8 state loads
    assert c.fp8_meta is None and torch.equal(c(x, [5, 0, 7]), a(x, [5, 0, 7]))
    with pytest.raises(ValueError, match="9 forward slots.*6"):
        te.GroupedLinear(2, 32, 16, device=device).load_state_dict(state, strict=False)


# --- Fp8Padding / Fp8Unpadding --------------------------------------------------------------

def test_padding_layout_round_trip_and_gradients(device):
    m_splits = [5, 0, 16, 17]
    x = torch.randn(38, 6, requires_grad=True, device=device)
    padded, padded_splits = te.Fp8Padding(4)(x, m_splits)
    assert padded_splits == [16, 0, 16, 32] and padded.shape == (64, 6)
    starts = [0, 16, 16, 32]
    for block, m, start, source in zip(range(4), m_splits, starts, torch.split(x, m_splits)):
        assert torch.equal(padded[start:start + m], source), block
    assert not padded[5:16].any() and not padded[49:64].any(), "padding rows are zeros"
    out = te.Fp8Unpadding(4)(padded, m_splits)
    assert torch.equal(out, x)
    dy = torch.randn(38, 6, device=device)
    out.backward(dy)
    assert torch.equal(x.grad, dy)
    # the gradient of the padding alone drops the padded rows' gradients
    x.grad = None
    g = torch.randn(64, 6, device=device)
    te.Fp8Padding(4)(x, m_splits)[0].backward(g)
    assert torch.equal(x.grad, torch.cat([g[0:5], g[16:32], g[32:49]]))


def test_padding_alignment_follows_the_recipe(device):
    x = torch.randn(3, 4, device=device)
    assert te.Fp8Padding(1)(x, [3])[1] == [16]
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        assert te.Fp8Padding(1)(x, [3])[1] == [32]
        assert te.Fp8Unpadding(1)(torch.randn(32, 4, device=device), [3]).shape == (3, 4)
    with te.autocast(recipe=recipe.Float8BlockScaling()):
        assert te.Fp8Padding(1)(x, [3])[1] == [16]
    assert te.Fp8Padding(1, align_size=8)(x, [3])[1] == [8]
    aligned = torch.randn(32, 4, device=device)
    out, splits = te.Fp8Padding(2)(aligned, [16, 16])
    assert out is aligned and splits == [16, 16] and te.Fp8Unpadding(2)(aligned, [16, 16]) is aligned


def test_padded_grouped_linear_equals_unpadded(device):
    """The MoE pattern: pad, GroupedLinear, unpad gives the unpadded result (zero rows only
    add rows of bias) in high precision and, with the same casts per split, in FP8."""
    torch.manual_seed(10)
    m = te.GroupedLinear(3, 32, 8, device=device)
    m_splits = [7, 0, 20]
    x = torch.randn(27, 32, requires_grad=True, device=device)
    pad, unpad = te.Fp8Padding(3), te.Fp8Unpadding(3)
    padded, padded_splits = pad(x, m_splits)
    y = unpad(m(padded, padded_splits), m_splits)
    assert_close(y, m(x, m_splits), name="padded high precision")
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).all()
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        padded, padded_splits = pad(x, m_splits)
        y8 = unpad(m(padded, padded_splits), m_splits)
        assert_close(y8, m(x, m_splits), name="padded fp8")  # zero rows change no amax


@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()])
def test_single_grouped_weight_is_one_parameter_and_computes_as_the_split_ones(device, fp8_recipe):
    torch.manual_seed(7)
    single = te.GroupedLinear(3, 64, 32, single_grouped_weight=True, single_grouped_bias=True, device=device)
    split = te.GroupedLinear(3, 64, 32, device=device)
    assert [name for name, _ in single.named_parameters()] == ["weight", "bias"]
    assert single.weight.shape == (3, 32, 64) and single.bias.shape == (3, 32)
    with torch.no_grad():
        single.bias.normal_()
        for i in range(3):
            getattr(split, f"weight{i}").copy_(single.weight[i])
            getattr(split, f"bias{i}").copy_(single.bias[i])
    x = torch.randn(10, 64, device=device)
    outs, grads = [], []
    for layer in (single, split):
        inp = x.clone().requires_grad_()
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = layer(inp, [4, 0, 6])
        y.square().sum().backward()
        outs.append(y)
        grads.append(inp.grad)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    for i in range(3):
        torch.testing.assert_close(single.weight.grad[i], getattr(split, f"weight{i}").grad, rtol=0, atol=0)
        torch.testing.assert_close(single.bias.grad[i], getattr(split, f"bias{i}").grad, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="single_grouped_weight"):
        te.GroupedLinear(2, 8, 8, single_grouped_weight=True, fuse_wgrad_accumulation=True, device=device)
