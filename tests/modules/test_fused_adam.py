"""te.optimizers.FusedAdam and its multi-tensor op: against torch.optim.AdamW/Adam over many
steps, bf16 params with fp32 master weights, state_dict round trips, param groups, skipped
params, grad scaling; the op against the reference on every CPU SIMD tier and on every backend
(tests/helpers/backends.py: the Triton kernel in the interpreter without a GPU), errors, also from
the fake kernel (opcheck and torch.compile of the ops: the op cases at the end)."""
import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from backends import assert_refused
from numerics import assert_close, assert_value_error_naming
from op_cases import BF16, F32, OpCases, randn

ops = torch.ops.portable_te
SIZES = [(7, 3), (33,), (1,), (0, 4), (130, 129)]  # 130*129 spans two kernel chunks


def make_params(dtype=torch.float32, sizes=SIZES):
    return [torch.nn.Parameter(torch.randn(size).to(dtype)) for size in sizes]


def set_grads(params, step, scale=1.0):
    gen = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.dtype)


def run(opt_ctor, params, steps=25, **kwargs):
    """`steps` optimizer steps on fixed random gradients; params is a list or a list of groups."""
    opt = opt_ctor(params, **kwargs)
    flat = [p for group in params for p in group["params"]] if isinstance(params[0], dict) else params
    for step in range(steps):
        set_grads(flat, step)
        opt.step()
        opt.zero_grad()
    return opt


HYPER = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam_l2"])
def test_fp32_matches_torch_over_many_steps(adam_w_mode):
    ours, theirs = make_params(), make_params()
    for a, b in zip(ours, theirs):
        b.data.copy_(a.data)
    run(te.optimizers.FusedAdam, ours, adam_w_mode=adam_w_mode, **HYPER)
    run(torch.optim.AdamW if adam_w_mode else torch.optim.Adam, theirs, **HYPER)
    for a, b in zip(ours, theirs):
        assert_close(a, b, name="param")


def test_bf16_params_follow_fp32_adamw_through_master_weights():
    fp32 = make_params()
    bf16 = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in fp32]
    for p, q in zip(fp32, bf16):
        p.data.copy_(q.data.float())  # the same starting values
    opt = te.optimizers.FusedAdam(bf16, master_weights=True, **HYPER)
    torch_opt = torch.optim.AdamW(fp32, **HYPER)
    for step in range(25):
        set_grads(bf16, step)
        for p, q in zip(fp32, bf16):
            p.grad = q.grad.float()  # identical (bf16-representable) gradients
        opt.step()
        torch_opt.step()
    for p, q in zip(fp32, bf16):
        master = opt.state[q]["master_param"]
        assert master.dtype == torch.float32
        assert_close(master, p, name="master")
        assert torch.equal(q.data, master.to(torch.bfloat16)), "param is the rounded master"


def test_state_dict_round_trip_continues_identically():
    params = make_params(torch.bfloat16)
    opt = run(te.optimizers.FusedAdam, params, steps=5, master_weights=True, **HYPER)
    saved = copy.deepcopy(opt.state_dict())
    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    restored = te.optimizers.FusedAdam(clones, master_weights=True, **HYPER)
    restored.load_state_dict(saved)
    for p in clones:
        assert all(restored.state[p][k].dtype == torch.float32 for k in ("exp_avg", "exp_avg_sq", "master_param"))
    for step in range(5, 10):
        for o, group in ((opt, params), (restored, clones)):
            set_grads(group, step)
            o.step()
    for p, q in zip(params, clones):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["master_param"], restored.state[q]["master_param"])


def test_param_groups_with_their_own_hyperparameters():
    ours, theirs = make_params(), make_params()
    for a, b in zip(ours, theirs):
        b.data.copy_(a.data)

    def groups(params):
        return [{"params": params[:2], "lr": 3e-2, "weight_decay": 0.0},
                {"params": params[2:], "betas": (0.5, 0.9), "eps": 1e-4}]
    run(te.optimizers.FusedAdam, groups(ours), **HYPER)
    run(torch.optim.AdamW, groups(theirs), **HYPER)
    for a, b in zip(ours, theirs):
        assert_close(a, b, name="param")


def test_params_without_grad_are_skipped():
    params = make_params()
    frozen = torch.nn.Parameter(torch.randn(5))
    opt = te.optimizers.FusedAdam(params + [frozen], **HYPER)
    before = frozen.detach().clone()
    set_grads(params, 0)
    opt.step()
    assert torch.equal(frozen, before) and frozen not in opt.state


def test_grad_scale_divides_gradients():
    ours, plain = make_params(), make_params()
    for a, b in zip(ours, plain):
        b.data.copy_(a.data)
    opt, plain_opt = te.optimizers.FusedAdam(ours, **HYPER), te.optimizers.FusedAdam(plain, **HYPER)
    for step in range(3):
        set_grads(ours, step, scale=1024.0)
        set_grads(plain, step)
        opt.step(grad_scale=torch.tensor(1024.0))
        plain_opt.step()
    for a, b in zip(ours, plain):
        assert_close(a, b, name="param")


def test_no_bias_correction_matches_reference():
    ours = make_params()
    copies = [p.detach().clone() for p in ours]
    opt = te.optimizers.FusedAdam(ours, bias_correction=False, **HYPER)
    m = [torch.zeros_like(p) for p in copies]
    v = [torch.zeros_like(p) for p in copies]
    for step in range(1, 6):
        set_grads(ours, step)
        opt.step()
        reference.adam_step(copies, [p.grad for p in ours], m, v, [], HYPER["lr"], *HYPER["betas"], HYPER["eps"], step,
                            False, HYPER["weight_decay"], True, 1.0)
    for a, b in zip(ours, copies):
        assert_close(a, b, name="param")


def test_zero_grad_and_set_grad_none():
    params = make_params()
    set_grads(params, 0)
    te.optimizers.FusedAdam(params).zero_grad()
    assert all(p.grad is None for p in params)
    set_grads(params, 0)
    te.optimizers.FusedAdam(params, set_grad_none=False).zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in params)


def test_unsupported_options_raise():
    params = make_params()
    with pytest.raises(RuntimeError, match="AMSGrad"):
        te.optimizers.FusedAdam(params, amsgrad=True)
    with pytest.raises(ValueError, match="exp_avg_dtype"):
        te.optimizers.FusedAdam(params, exp_avg_dtype=torch.int8)
    with pytest.raises(ValueError, match="master_weight_dtype"):
        te.optimizers.FusedAdam(params, master_weights=True, master_weight_dtype=torch.bfloat16)


@pytest.mark.parametrize("exp_avg_dtype, exp_avg_sq_dtype, tol", [
    (torch.float16, torch.float32, 2e-3), (torch.float32, torch.float16, 2e-3),
    (torch.uint8, torch.float32, 0.125), (torch.float32, torch.uint8, 0.125)])  # E4M3: 3 mantissa bits
def test_scaled_moment_states_follow_the_float32_update(exp_avg_dtype, exp_avg_sq_dtype, tol):
    """TE's scaled states: one float32 scale per tensor, amax / range, so each stored moment
    spans its format; the widened values are the float32 moments within the format's precision."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(300) * 1e-3), torch.nn.Parameter(torch.randn(4, 7))]
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    scaled = te.optimizers.FusedAdam(params, lr=1e-2, exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype)
    exact = te.optimizers.FusedAdam(twin, lr=1e-2)
    for _ in range(4):
        for p, q in zip(params, twin):
            p.grad = torch.randn_like(p) * 1e-3
            q.grad = p.grad.clone()
        scaled.step()
        exact.step()
    for p, q in zip(params, twin):
        for name, dtype in (("exp_avg", exp_avg_dtype), ("exp_avg_sq", exp_avg_sq_dtype)):
            stored = scaled.state[p][name]
            assert stored.dtype == dtype
            values = scaled.get_unscaled_state(p, name)
            reference = exact.get_unscaled_state(q, name)
            torch.testing.assert_close(values, reference, rtol=tol, atol=tol * reference.abs().max().item())
            if dtype in (torch.float16, torch.uint8):  # the largest magnitude sits at the format's top
                top = torch.finfo(torch.float16 if dtype == torch.float16 else torch.float8_e4m3fn).max
                widest = (stored.view(torch.float8_e4m3fn) if dtype == torch.uint8 else stored).float().abs().max()
                assert widest.item() == pytest.approx(top, rel=1e-3)
        torch.testing.assert_close(p, q, rtol=tol, atol=1e-3)
    state = scaled.state_dict()
    again = te.optimizers.FusedAdam(params, lr=1e-2, exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype)
    again.load_state_dict(state)
    for p in params:
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(again.get_unscaled_state(p, name), scaled.get_unscaled_state(p, name),
                                       rtol=0, atol=0)


def test_param_remainders_reconstruct_the_float32_master_exactly():
    """store_param_remainders: a bf16 param plus its int16 remainder is the float32 master, bit
    for bit, so the steps equal master_weights=True's."""
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(257).bfloat16()), torch.nn.Parameter(torch.randn(5, 3).bfloat16())]
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    compact = te.optimizers.FusedAdam(params, lr=1e-2, master_weights=True, store_param_remainders=True)
    full = te.optimizers.FusedAdam(twin, lr=1e-2, master_weights=True)
    for _ in range(5):
        for p, q in zip(params, twin):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        compact.step()
        full.step()
    for p, q in zip(params, twin):
        assert compact.state[p]["master_param"].dtype == torch.int16
        assert torch.equal(p, q)
        assert torch.equal(compact.get_unscaled_state(p, "master_param"), full.get_unscaled_state(q, "master_param"))


def test_fp16_master_and_capturable():
    torch.manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(64).bfloat16())]
    twin = [torch.nn.Parameter(params[0].detach().clone())]
    half = te.optimizers.FusedAdam(params, lr=1e-2, master_weights=True, master_weight_dtype=torch.float16,
                                   capturable=True)
    full = te.optimizers.FusedAdam(twin, lr=1e-2, master_weights=True)
    for _ in range(3):
        params[0].grad = torch.randn_like(params[0])
        twin[0].grad = params[0].grad.clone()
        half.step()
        full.step()
    assert half.state[params[0]]["master_param"].dtype == torch.float16
    torch.testing.assert_close(half.get_unscaled_state(params[0], "master_param"),
                               full.get_unscaled_state(twin[0], "master_param"), rtol=2e-3, atol=2e-3)


def scaled_steps(optimizer, params, scaler, losses):
    """One GradScaler step per loss weight: loss = weight * sum(p); a weight of inf gives inf gradients."""
    for weight in losses:
        loss = sum((p.float() * weight).sum() for p in params)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def test_capturable_takes_grad_scaler_scale_into_its_step():
    """capturable=True, as TE's: GradScaler hands its scale and found_inf to the step, which
    unscales the gradients in place (GradScaler.unscale_'s result) and skips a step with an inf."""
    torch.manual_seed(3)
    ours = [torch.nn.Parameter(torch.randn(5, 7)), torch.nn.Parameter(torch.randn(9))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    fused = te.optimizers.FusedAdam(ours, lr=1e-2, capturable=True)
    assert fused._step_supports_amp_scaling
    plain = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.0)
    fused_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    plain_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    losses = [1.0, 0.5, float("inf"), 2.0]
    scaled_steps(fused, ours, fused_scaler, losses[:2])
    scaled_steps(plain, theirs, plain_scaler, losses[:2])
    before = [p.detach().clone() for p in ours]
    scaled_steps(fused, ours, fused_scaler, losses[2:3])  # skipped, and the scale halves
    scaled_steps(plain, theirs, plain_scaler, losses[2:3])
    for p, q in zip(ours, before):
        assert torch.equal(p, q)
    assert fused_scaler.get_scale() == plain_scaler.get_scale() == 2.0 ** 9
    assert fused.param_groups[0]["step"] == 2
    for p in ours + theirs:  # the last backward's gradients, unscaled in place
        p.grad = None
    for params, optimizer, scaler in ((ours, fused, fused_scaler), (theirs, plain, plain_scaler)):
        loss = sum((p * 2.0).sum() for p in params)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    for p, q in zip(ours, theirs):
        assert torch.equal(p.grad, torch.full_like(p, 2.0)) and torch.equal(q.grad, p.grad)
        assert_close(p, q, name="param")


def test_capturable_fp16_params_with_master_weights_under_grad_scaler():
    """GradScaler refuses to unscale fp16 gradients itself; a capturable FusedAdam unscales them
    in its step, its float32 masters following float32 AdamW (TE's capturable master path)."""
    torch.manual_seed(4)
    wide = torch.randn(64)
    params = [torch.nn.Parameter(wide.half())]
    reference_params = [torch.nn.Parameter(wide.half().float())]
    fused = te.optimizers.FusedAdam(params, lr=1e-2, capturable=True, master_weights=[wide])
    assert fused.master_weights is True
    plain = torch.optim.AdamW(reference_params, lr=1e-2, weight_decay=0.0)
    for optimizer, group in ((fused, params), (plain, reference_params)):
        scaled_steps(optimizer, group, torch.amp.GradScaler("cpu", init_scale=2.0 ** 8), [1.0, 0.25, 3.0])
    assert_close(fused.get_unscaled_state(params[0], "master_param"), reference_params[0].detach(), name="master")
    assert torch.equal(params[0], fused.get_unscaled_state(params[0], "master_param").half())


def test_bf16_moments_are_the_float32_update_rounded_once_per_step():
    """exp_avg_dtype / exp_avg_sq_dtype=bf16: the same step on widened moments, each stored
    rounded; the params follow AdamW within the moments' precision."""
    params = [torch.nn.Parameter(torch.randn(257)), torch.nn.Parameter(torch.randn(3, 5))]
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    bf16 = te.optimizers.FusedAdam(params, lr=1e-2, weight_decay=0.01, exp_avg_dtype=torch.bfloat16,
                                   exp_avg_sq_dtype=torch.bfloat16)
    fp32 = te.optimizers.FusedAdam(twin, lr=1e-2, weight_decay=0.01)
    for step in range(3):
        for p, q in zip(params, twin):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        # the bf16 optimizer's state before the step, as the float32 one's: one step must match
        for p, q in zip(params, twin):
            if step:
                for name in ("exp_avg", "exp_avg_sq"):
                    fp32.set_scaled_state(q, name, bf16.get_unscaled_state(p, name))
                q.data.copy_(p.data)
        bf16.step()
        fp32.step()
        for p, q in zip(params, twin):
            assert bf16.state[p]["exp_avg"].dtype == torch.bfloat16
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(bf16.state[p][name], fp32.state[q][name].bfloat16())
            assert torch.equal(p, q)
    saved = bf16.state_dict()
    again = te.optimizers.FusedAdam([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-2,
                                    exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.bfloat16)
    again.load_state_dict(saved)
    assert again.state[again.param_groups[0]["params"][0]]["exp_avg"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="master_param"):
        bf16.get_unscaled_state(params[0], "master_param")


@pytest.mark.parametrize("bad,words", [
    ({"lr": float("nan")}, ["learning rate", "nan"]), ({"lr": -1e-3}, ["learning rate", "-0.001"]),
    ({"eps": float("nan")}, ["epsilon", "nan"]), ({"eps": -1.0}, ["epsilon", "-1.0"]),
    ({"weight_decay": float("nan")}, ["weight_decay", "nan"]), ({"weight_decay": -0.1}, ["weight_decay", "-0.1"]),
    ({"betas": (1.0, 0.999)}, ["beta", "index 0", "1.0"]), ({"betas": (0.9, -0.1)}, ["beta", "index 1", "-0.1"]),
    ({"betas": (0.9, float("nan"))}, ["beta", "index 1", "nan"])], ids=str)
def test_bad_hyperparameters_are_refused_as_torch_does(bad, words):
    """NaN passed the old `lr < 0` check; torch.optim.Adam refuses the same values."""
    with pytest.raises(ValueError):
        torch.optim.Adam(make_params(), **bad)
    assert_value_error_naming(lambda: te.optimizers.FusedAdam(make_params(), **bad), ["FusedAdam"] + words)
    assert_value_error_naming(lambda: te.optimizers.FusedAdam([{"params": make_params(), **bad}]),
                              ["FusedAdam (param group 0)"] + words)


def test_betas_must_be_a_pair():
    assert_value_error_naming(lambda: te.optimizers.FusedAdam(make_params(), betas=(0.9,)), ["betas", "pair", "(0.9,)"])


def test_param_group_without_params_or_grads_is_skipped():
    """As torch.optim.Adam: a group with no params (or none with a gradient) changes nothing,
    and every group reports its step count."""
    params, frozen = make_params(), make_params()
    opt = te.optimizers.FusedAdam([{"params": params}, {"params": []}, {"params": frozen, "lr": 0.1}], **HYPER)
    before = [p.detach().clone() for p in frozen]
    for step in range(2):
        set_grads(params, step)
        opt.step()
    assert [group["step"] for group in opt.param_groups] == [2, 0, 0]
    assert all(torch.equal(p, b) for p, b in zip(frozen, before))
    restored = te.optimizers.FusedAdam([{"params": params}, {"params": []}, {"params": frozen, "lr": 0.1}], **HYPER)
    restored.load_state_dict(opt.state_dict())
    opt.zero_grad()
    set_grads(frozen, 0)
    restored.step()
    assert [group["step"] for group in restored.param_groups] == [2, 0, 1]


def op_inputs(param_dtype, grad_dtype, with_master, device="cpu"):
    params = [torch.randn(size).to(device, param_dtype) for size in SIZES]
    grads = [torch.randn(size).to(device, grad_dtype) for size in SIZES]
    exp_avgs = [torch.randn(size).abs().to(device) * 0.1 for size in SIZES]
    exp_avg_sqs = [torch.randn(size).abs().to(device) * 0.1 for size in SIZES]
    masters = [p.float() + 0.01 * torch.randn(p.shape).to(device) for p in params] if with_master else []
    return params, grads, exp_avgs, exp_avg_sqs, masters


def check_op_against_reference(param_dtype, grad_dtype, with_master, adam_w_mode, beta1=0.9, device="cpu"):
    ours = op_inputs(param_dtype, grad_dtype, with_master, device)
    want = copy.deepcopy(ours)
    updated = [t for tensors in ours for t in tensors]
    hyper = (1e-2, beta1, 0.999, 1e-8, 3, True, 0.05, adam_w_mode, 0.5)
    ops.multi_tensor_adam(*ours, *hyper)
    reference.adam_step(*want, *hyper)
    assert all(a is b for a, b in zip(updated, (t for tensors in ours for t in tensors))), "in place"
    for name, got_list, want_list in zip(("param", "grad", "exp_avg", "exp_avg_sq", "master"), ours, want):
        for got, expected in zip(got_list, want_list):
            # a bf16/fp16 param without a master may round differently after a 1-ulp fp32 difference
            assert_close(got, expected, dtype=torch.float32 if got.dtype == torch.float32 else None, name=name)


OP_CASES = [(torch.float32, torch.float32, False), (torch.bfloat16, torch.bfloat16, True),
            (torch.float16, torch.float32, True), (torch.bfloat16, torch.bfloat16, False)]


@pytest.mark.parametrize("param_dtype,grad_dtype,with_master", OP_CASES, ids=str)
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam_l2"])
def test_op_matches_reference_on_every_tier(cpu_tier, param_dtype, grad_dtype, with_master, adam_w_mode):
    check_op_against_reference(param_dtype, grad_dtype, with_master, adam_w_mode)


@pytest.mark.parametrize("param_dtype,grad_dtype,with_master", OP_CASES, ids=str)
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam_l2"])
@pytest.mark.parametrize("beta1", [0.9, 0.3], ids=["beta1=0.9", "beta1=0.3"])  # lerp from m, from the gradient
def test_op_matches_reference_on_every_backend(backend, param_dtype, grad_dtype, with_master, adam_w_mode, beta1):
    check_op_against_reference(param_dtype, grad_dtype, with_master, adam_w_mode, beta1, backend.device)


_HYPER = (1e-3, 0.9, 0.999, 1e-8, 1, True, 0.0, True, 1.0)


def _adam(params=None, grads=None, exp_avgs=None, exp_avg_sqs=None, masters=(), hyper=_HYPER):
    """multi_tensor_adam on two fp32 [3, 4] params (zeros), with the lists given replaced."""
    def default(given, make):
        return list(given) if given is not None else [make() for _ in range(2)]
    params = default(params, lambda: torch.zeros(3, 4))
    tensors = [params] + [default(given, lambda: torch.zeros(3, 4)) for given in (grads, exp_avgs, exp_avg_sqs)]
    ops.multi_tensor_adam(*tensors, list(masters), *hyper)


@pytest.mark.parametrize("call,words", [
    (lambda: _adam(grads=[torch.zeros(3, 4)]), ["grads", "one entry per param", "2, 1, 2 and 2"]),
    (lambda: _adam(masters=[torch.zeros(3, 4)]), ["master_params", "empty or have one entry", "1 for 2"]),
    (lambda: _adam(hyper=(*_HYPER[:4], 0, *_HYPER[5:])), ["step counts from 1", "0"]),
    (lambda: _adam(hyper=(_HYPER[0], 0.9, 1.0, *_HYPER[3:])), ["betas", "[0, 1)", "(0.9, 1)"]),
    (lambda: _adam(params=[torch.zeros(3, 4, dtype=torch.int64)] * 2), ["params[0]", "Long", "[3, 4]"]),
    (lambda: _adam(params=[torch.zeros(3, 4, dtype=torch.float64)] * 2), ["params[0]", "float64"]),
    (lambda: _adam(params=[torch.zeros(4, 3).t()] * 2), ["params[0]", "[3, 4]", "contiguous"]),
    (lambda: _adam(grads=[torch.zeros(3, 4), torch.zeros(4, 3)]), ["grads[1]", "[4, 3]", "params[1]", "[3, 4]"]),
    (lambda: _adam(grads=[torch.zeros(3, 4, dtype=torch.float64)] * 2), ["grads[0]", "float64"]),
    (lambda: _adam(grads=[torch.zeros(3, 4).to("meta")] * 2), ["grads[0]", "meta", "params[0]", "cpu"]),
    (lambda: _adam(exp_avgs=[torch.zeros(3)] * 2), ["exp_avgs[0]", "[3]", "[3, 4]"]),
    (lambda: _adam(exp_avgs=[torch.zeros(3, 4, dtype=torch.bfloat16)] * 2), ["exp_avgs[0]", "BFloat16", "Float"]),
    (lambda: _adam(exp_avg_sqs=[torch.zeros(4, 3).t()] * 2), ["exp_avg_sqs[0]", "contiguous", "in place"]),
    (lambda: _adam(masters=[torch.zeros(3, 4), torch.zeros(3, 4).to("meta")]),
     ["master_params[1]", "meta", "its param", "cpu"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_op_bad_arguments(backend, call, words):
    """On every backend (the Triton kernel and the reference check in Python, custom_ops/adam.py,
    as the compiled op does), and in the fake kernel torch.compile traces with."""
    assert_refused(backend, call, words)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bench_case_providers_run(dtype):
    from transformer_engine.bench.adam_cases import adam_case
    case = adam_case((16, 1, dtype), torch.device("cpu"))
    assert case.shape[0] == 12 * 16 * 16 + 4 * 16 and case.bytes == 28 * case.shape[0]
    assert {"ours", "eager", "compile"} <= set(case.providers)
    for name in ("ours", "eager"):
        case.providers[name]()


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("adam", references={"multi_tensor_adam": reference.adam_step})


def _adam_lists(d, sizes, param_dtype, grad_dtype, with_master):
    params = [randn(d, *s, dtype=param_dtype) for s in sizes]
    grads = [randn(d, *s, dtype=grad_dtype) for s in sizes]
    exp_avgs = [randn(d, *s, dtype=F32).abs() * 0.1 for s in sizes]
    exp_avg_sqs = [randn(d, *s, dtype=F32).abs() * 0.1 for s in sizes]
    masters = [p.float() + 0.01 * randn(d, *p.shape, dtype=F32) for p in params] if with_master else []
    return params, grads, exp_avgs, exp_avg_sqs, masters


@CASES.case("multi_tensor_adam")
def _(d):
    params = [randn(d, 5, 7, dtype=F32), randn(d, 33, dtype=F32)]
    grads = [torch.randn_like(p) for p in params]
    moments = [torch.zeros_like(p) for p in params]
    return (params, grads, moments, [m.clone() for m in moments], [], 1e-3, 0.9, 0.999, 1e-8, 1, True, 0.01, True,
            1.0), ()


# Adam: bf16 parameters and gradients with fp32 master weights, an empty tensor and one
# spanning two kernel chunks.
@CASES.case("multi_tensor_adam[bf16, master weights]", compile=False)
def _(d):
    lists = _adam_lists(d, [(7, 3), (33,), (1,), (0, 4), (130, 129)], BF16, BF16, True)
    return (*lists, 1e-3, 0.9, 0.999, 1e-8, 1, True, 0.01, True, 1.0), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
