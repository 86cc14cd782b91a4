"""Fused cross-entropy ops: loss and gradient against torch.nn.functional.cross_entropy
(label smoothing, ignore_index, every reduction) on every CPU SIMD tier and on every backend
(tests/helpers/backends.py: the Triton kernels too), odd and empty shapes, long vocabularies,
non-contiguous logits; TE's parallel_cross_entropy; plus gradcheck, torch.compile of the
reductions around the op, and argument errors (opcheck and torch.compile of the ops: the op cases at the end)."""
import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from backends import assert_refused
from numerics import assert_close, assert_two_reference, assert_value_error_naming
from op_cases import F32, OpCases, randn

ops = torch.ops.portable_te
SHAPES = [(1, 1), (37, 69), (16, 1000), (2, 3, 17), (0, 10), (3, 20000)]


def make_inputs(shape, dtype, ignore_index=-100, ignored_fraction=0.25, device="cpu"):
    logits = (torch.randn(shape) * 3).to(device=device, dtype=dtype)
    target = torch.randint(0, shape[-1], shape[:-1])
    target[torch.rand(shape[:-1]) < ignored_fraction] = ignore_index
    return logits, target.to(device)


def run_fused(logits, target, grad_loss=None, **kwargs):
    logits = logits.detach().requires_grad_()
    loss = te.kernels.cross_entropy(logits, target, **kwargs)
    loss.backward(torch.ones_like(loss) if grad_loss is None else grad_loss)
    return loss, logits.grad


def run_torch(logits, target, dtype, grad_loss=None, **kwargs):
    """F.cross_entropy (class dim moved to 1) in `dtype`, with autograd."""
    logits = logits.detach().to(dtype).requires_grad_()
    loss = F.cross_entropy(logits.movedim(-1, 1) if logits.dim() > 2 else logits, target, **kwargs)
    loss.backward(torch.ones_like(loss) if grad_loss is None else grad_loss.to(dtype))
    return loss, logits.grad


def check_float32_matches_torch(shape, reduction, label_smoothing, device):
    logits, target = make_inputs(shape, torch.float32, device=device)
    grad_loss = torch.randn(shape[:-1], device=device) if reduction == "none" else None
    kwargs = dict(reduction=reduction, label_smoothing=label_smoothing)
    loss, grad = run_fused(logits, target, grad_loss, **kwargs)
    loss_ref, grad_ref = run_torch(logits, target, torch.float64, grad_loss, **kwargs)
    assert loss.dtype == torch.float32 and grad.dtype == torch.float32
    assert_close(loss, loss_ref.float(), name="loss", rtol=1e-5)
    assert_close(grad, grad_ref.float(), name="grad_logits")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_float32_matches_torch_on_every_tier(cpu_tier, shape, reduction, label_smoothing):
    check_float32_matches_torch(shape, reduction, label_smoothing, "cpu")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_float32_matches_torch_on_every_backend(backend, shape, reduction, label_smoothing):
    check_float32_matches_torch(shape, reduction, label_smoothing, backend.device)


def check_low_precision_two_reference_rule(dtype, label_smoothing, device):
    logits, target = make_inputs((64, 3000), dtype, device=device)
    loss, grad = run_fused(logits, target, label_smoothing=label_smoothing)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    loss_exact, grad_exact = run_torch(logits, target, torch.float64, label_smoothing=label_smoothing)
    loss_plain, grad_plain = run_torch(logits, target, dtype, label_smoothing=label_smoothing)
    assert_two_reference(loss, loss_plain, loss_exact, 2, name="loss")
    assert_two_reference(grad, grad_plain, grad_exact, 3, name="grad_logits")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_low_precision_two_reference_rule(cpu_tier, dtype, label_smoothing):
    check_low_precision_two_reference_rule(dtype, label_smoothing, "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_low_precision_two_reference_rule_on_every_backend(backend, dtype, label_smoothing):
    check_low_precision_two_reference_rule(dtype, label_smoothing, backend.device)


def test_matches_the_reference_ops(backend):
    logits, target = make_inputs((9, 130), torch.bfloat16, ignore_index=-1, device=backend.device)
    loss, grad = ops.cross_entropy_fwd(logits, target, 0.2, -1, True)
    loss_ref, grad_ref = reference.cross_entropy_fwd(logits, target, 0.2, -1, True)
    assert_close(loss, loss_ref, rtol=1e-5)
    assert_close(grad, grad_ref)
    grad_loss = torch.randn(9, device=backend.device)
    assert_close(ops.cross_entropy_bwd(grad, grad_loss), reference.cross_entropy_bwd(grad_ref, grad_loss))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_tokens_ignored_behaves_like_torch(backend, reduction):
    logits, target = make_inputs((4, 7), torch.float32, ignored_fraction=1.0, device=backend.device)
    loss, grad = run_fused(logits, target, reduction=reduction)
    loss_ref, grad_ref = run_torch(logits, target, torch.float32, reduction=reduction)
    assert_close(loss, loss_ref, name="loss")  # mean: NaN (0 / 0), as torch
    assert_close(grad, grad_ref, name="grad_logits")


def test_custom_ignore_index_and_non_contiguous_logits(backend):
    logits = torch.randn(50, 12, device=backend.device).t()  # [12, 50], non-contiguous
    target = torch.randint(0, 50, (12,), device=backend.device)
    target[::3] = 7  # ignore_index 7 is also a valid class: those tokens must be skipped
    loss, grad = run_fused(logits, target, ignore_index=7)
    loss_ref, grad_ref = run_torch(logits, target, torch.float64, ignore_index=7)
    assert_close(loss, loss_ref.float(), rtol=1e-5)
    assert_close(grad, grad_ref.float())


def test_inference_skips_the_gradient(backend):
    logits, target = make_inputs((5, 9), torch.float32, device=backend.device)
    with torch.no_grad():
        loss = te.kernels.cross_entropy(logits.requires_grad_(), target, reduction="none")
    _, grad = ops.cross_entropy_fwd(logits.detach(), target, 0.0, -100, False)
    assert grad.shape == (0, 9)
    assert_close(loss, F.cross_entropy(logits.detach(), target, reduction="none"))


@pytest.mark.parametrize("layout", ["sbv", "bsv"])
@pytest.mark.parametrize("reduce_loss", [False, True])
def test_parallel_cross_entropy_matches_te_semantics(layout, reduce_loss):
    inp, target = make_inputs((6, 3, 41), torch.bfloat16)
    loss = te.parallel_cross_entropy(inp, target, 0.1, reduce_loss, None, -100)
    flat = F.cross_entropy(inp.double().reshape(-1, 41), target.reshape(-1), label_smoothing=0.1,
                           reduction="none").reshape(6, 3)
    want = flat.sum() / (target != -100).sum() if reduce_loss else flat
    assert loss.dtype == torch.float32 and loss.shape == want.shape
    assert_close(loss, want.float(), rtol=1e-5)
    assert te.cross_entropy.parallel_cross_entropy is te.parallel_cross_entropy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("reduce_loss", [False, True])
def test_parallel_cross_entropy_saves_the_fp32_gradient_and_rounds_once(dtype, reduce_loss):
    """As TE: the forward saves one fp32 tensor (the gradient), leaves the logits alone, and the
    backward applies the loss's gradient in fp32 before the one rounding to the logits' dtype."""
    inp, target = make_inputs((4, 3, 50), dtype)
    before = inp.clone()
    inp.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = te.parallel_cross_entropy(inp, target, 0.1, reduce_loss, None, -100)
    assert len(saved) == 1 and saved[0].dtype == torch.float32 and saved[0].shape == (12, 50)
    assert torch.equal(inp.detach(), before)
    upstream = torch.rand(()) if reduce_loss else torch.rand(4, 3) * 100
    loss.backward(upstream)
    reference = before.float().requires_grad_()
    per_token = F.cross_entropy(reference.reshape(-1, 50), target.reshape(-1), label_smoothing=0.1,
                                reduction="none").reshape(4, 3)
    kept = (target != -100).sum()
    (per_token.sum() / kept if reduce_loss else per_token).backward(upstream)
    # bf16 / fp16: one rounding of the fp32 gradient, the reference's but for fp32 ties. fp32: the
    # kernel's softmax against torch's (a few ulps apart; more, relatively, where p - 1 cancels).
    rtol, atol = (1e-5, 1e-7) if dtype == torch.float32 else (float(torch.finfo(dtype).eps), 1e-30)
    assert_close(inp.grad.float(), reference.grad.to(dtype).float(), rtol=rtol, atol=atol)


def test_parallel_cross_entropy_float64_and_compile():
    inp, target = make_inputs((2, 5, 30), torch.float64)
    loss = te.parallel_cross_entropy(inp.requires_grad_(), target)
    assert loss.dtype == torch.float64
    loss.sum().backward()
    want = torch.func.grad(lambda x: F.cross_entropy(x.reshape(-1, 30), target.reshape(-1), reduction="sum"))(
        inp.detach())
    torch.testing.assert_close(inp.grad, want)
    compiled = torch.compile(te.parallel_cross_entropy, fullgraph=True, backend="aot_eager")
    x = inp.detach().float().requires_grad_()
    compiled(x, target, 0.0, True).backward()
    eager = inp.detach().float().requires_grad_()
    te.parallel_cross_entropy(eager, target, 0.0, True).backward()
    assert torch.equal(x.grad, eager.grad)


def test_gradcheck_float64():
    logits, target = make_inputs((5, 7), torch.float64)
    for reduction in ("mean", "none"):
        assert torch.autograd.gradcheck(
            lambda x: te.kernels.cross_entropy(x, target, label_smoothing=0.15, reduction=reduction),
            (logits.requires_grad_(),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mean_backward_hands_on_the_forward_gradient(dtype):
    """A mean's forward writes the gradient times 1 / kept tokens, so loss.backward() runs no
    backward kernel; any other upstream gradient still scales it."""
    logits, target = make_inputs((37, 690), dtype)
    for upstream in (1.0, 2.5, -0.75):
        x = logits.clone().requires_grad_()
        loss = te.kernels.cross_entropy(x, target)
        with torch.autograd.profiler.profile() as prof:
            loss.backward(torch.tensor(upstream))
        ran_backward_kernel = any("cross_entropy_bwd" in event.name for event in prof.function_events)
        assert ran_backward_kernel == (upstream != 1.0)
        exact = run_torch(logits, target, torch.float64, grad_loss=torch.tensor(upstream))[1]
        if dtype == torch.float32:
            assert_close(x.grad, exact.float(), name="grad_logits")
        else:
            plain = run_torch(logits, target, dtype, grad_loss=torch.tensor(upstream))[1]
            assert_two_reference(x.grad, plain, exact, 3.0, name="grad_logits")


def test_mean_gradient_is_rounded_once():
    """bf16: the forward rounds (softmax - onehot) / kept once; the bf16 gradient scaled by
    1 / kept and rounded again differs from that in about a quarter of the elements."""
    logits, target = make_inputs((15, 1000), torch.bfloat16, ignored_fraction=0.0)
    x = logits.clone().requires_grad_()
    te.kernels.cross_entropy(x, target).backward()
    rounded_once = reference.cross_entropy_fwd(logits, target, 0.0, -100, True, torch.tensor(1 / 15))[1]
    rounded_twice = (reference.cross_entropy_fwd(logits, target, 0.0, -100, True)[1].float() / 15).bfloat16()
    assert (rounded_once != rounded_twice).float().mean() > 0.1  # the check below can tell them apart
    assert (x.grad != rounded_once).float().mean() < 0.01  # fp32 ulps may still flip a rare rounding


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_fullgraph_matches_eager(backend, reduction):
    logits, target = make_inputs((8, 3, 29), torch.float32, device=backend.device)
    compiled = torch.compile(lambda x, t: te.kernels.cross_entropy(x, t, label_smoothing=0.1, reduction=reduction),
                             fullgraph=True)
    xc = logits.clone().requires_grad_()
    loss = compiled(xc, target)
    loss.backward(torch.ones_like(loss))
    loss_eager, grad_eager = run_fused(logits, target, label_smoothing=0.1, reduction=reduction)
    assert torch.equal(loss, loss_eager) and torch.equal(xc.grad, grad_eager)


def test_out_of_range_target_names_the_value(backend):
    """Checked where the target's values are on the host: on a GPU the check would cost a
    device sync (the Triton kernel gives the row a NaN loss instead: test_triton_cross_entropy)."""
    if backend.device.type != "cpu":
        pytest.skip("the target's values are on the device")
    logits = torch.randn(4, 10)
    for bad in (10, -3):
        target = torch.tensor([1, 2, bad, 3])
        assert_value_error_naming(lambda: te.kernels.cross_entropy(logits, target),
                                  ["target[2]", f"= {bad}", "10 classes", "ignore_index = -100"])


def logits4():
    return torch.randn(4, 10)


BAD_CALLS = [
    (lambda: te.kernels.cross_entropy(logits4(), torch.zeros(5, dtype=torch.long)), ["(4, 10)", "(5,)"]),
    (lambda: te.kernels.cross_entropy(logits4(), torch.zeros(4, dtype=torch.int32)), ["target", "Int", "Long"]),
    (lambda: te.kernels.cross_entropy(logits4().int(), torch.zeros(4, dtype=torch.long)), ["logits", "Int"]),
    (lambda: te.kernels.cross_entropy(logits4(), torch.zeros(4, dtype=torch.long), reduction="avg"), ["reduction", "avg"]),
    (lambda: te.kernels.cross_entropy(logits4(), torch.zeros(4, dtype=torch.long), label_smoothing=1.5),
     ["label_smoothing", "1.5"]),
    (lambda: te.kernels.cross_entropy(torch.randn(4, 0), torch.zeros(4, dtype=torch.long)), ["class", "[4, 0]"]),
    (lambda: ops.cross_entropy_bwd(torch.randn(4, 10), torch.randn(3)), ["grad_loss", "[3]", "[4]"]),
    (lambda: ops.cross_entropy_fwd(logits4(), torch.zeros(4, dtype=torch.long), 0.0, -100, True, torch.ones(3)),
     ["grad_scale", "[3]", "[4]"]),
    (lambda: ops.cross_entropy_fwd(logits4(), torch.zeros(4, dtype=torch.long), 0.0, -100, True,
                                   torch.tensor(1.0, dtype=torch.float64)), ["grad_scale", "Double", "Float"]),
    (lambda: te.parallel_cross_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.long)), ["inp", "(4, 10)"]),
    (lambda: ops.cross_entropy_fwd(torch.randn(2, 3, 4), torch.zeros(2, dtype=torch.long), 0.0, -100, True),
     ["logits", "[2, 3, 4]"]),
    (lambda: ops.cross_entropy_bwd(logits4(), torch.randn(4, dtype=torch.float64)), ["grad_loss", "Double", "Float"]),
    (lambda: ops.cross_entropy_fwd(logits4(), torch.zeros(4, dtype=torch.long, device="meta"), 0.0, -100, True),
     ["target", "meta"]),
]


@pytest.mark.parametrize("call,words", BAD_CALLS)
def test_bad_input_raises_value_error_naming_argument(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python,
    custom_ops/cross_entropy.py), and in the fake kernels torch.compile traces with."""
    assert_refused(backend, call, words)


def float64_loss(logits, target, label_smoothing=0.0):
    return F.cross_entropy(logits.double(), target, label_smoothing=label_smoothing, reduction="none")


def check_large_logits_keep_the_small_part_of_the_loss(label_smoothing, device):
    two = torch.tensor([[1e30, 1e30]], device=device)
    loss = te.kernels.cross_entropy(two, torch.tensor([0], device=device), label_smoothing=label_smoothing,
                                reduction="none")
    assert_close(loss.double(), torch.full((1,), 0.6931471805599453, dtype=torch.float64), rtol=1e-6)
    for offset in (1e5, 3e6, -2e7):
        x = (torch.randn(6, 67) * 2 + offset).to(device)
        target = torch.randint(0, 67, (6,)).to(device)
        want = float64_loss(x, target, label_smoothing)  # exact on the fp32 logits
        for got in (te.kernels.cross_entropy(x, target, label_smoothing=label_smoothing, reduction="none"),
                    reference.cross_entropy_fwd(x, target, label_smoothing, -100, False)[0]):
            assert_close(got.double(), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_large_logits_keep_the_small_part_of_the_loss(cpu_tier, label_smoothing):
    """Issue 18, item 5: the loss is log s - (x_t - max), so the max does not absorb log s
    (logits of 1e30 gave 0 for log 2; near 1e5, where an fp32 ulp is 0.008, 3.99219 for
    3.99270). Vocabularies long enough for vector bodies and scalar tails."""
    check_large_logits_keep_the_small_part_of_the_loss(label_smoothing, "cpu")


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_large_logits_keep_the_small_part_of_the_loss_on_every_backend(backend, label_smoothing):
    check_large_logits_keep_the_small_part_of_the_loss(label_smoothing, backend.device)


def test_parallel_cross_entropy_bf16_gradient_rounded_once():
    """Issue 18, item 6: with an upstream gradient that is not 1, the bf16 gradient is computed
    and scaled in fp32 and rounded once (-0.006653, not -0.006683)."""
    logits = torch.zeros(2, 2, 3, dtype=torch.bfloat16, requires_grad=True)
    target = torch.tensor([[0, 1], [2, -100]])
    grad_loss = torch.tensor([[.01, .03], [.1, .7]])
    te.parallel_cross_entropy(logits, target).backward(grad_loss)
    want = once_rounded_gradient(logits, target, grad_loss)
    assert torch.equal(logits.grad, want)
    assert logits.grad[0, 0, 0].item() == torch.tensor(-0.00666666, dtype=torch.bfloat16).item()


def once_rounded_gradient(logits, target, grad_loss, label_smoothing=0.0):
    """The float64 gradient of sum(grad_loss * loss), rounded once to the logits' dtype."""
    x = logits.detach().double().requires_grad_()
    flat = x.reshape(-1, x.shape[-1])
    loss = F.cross_entropy(flat, target.reshape(-1), label_smoothing=label_smoothing, reduction="none")
    (loss * grad_loss.reshape(-1).double()).sum().backward()
    return x.grad.to(logits.dtype)


def check_unreduced_gradient_rounded_once(dtype, device):
    logits, target = make_inputs((5, 7, 300), dtype, device=device)
    grad_loss = (torch.rand(5, 7) * 3).to(device)
    for label_smoothing in (0.0, 0.2):
        x = logits.detach().requires_grad_()
        te.parallel_cross_entropy(x, target, label_smoothing).backward(grad_loss)
        want = once_rounded_gradient(logits, target, grad_loss, label_smoothing)
        # fp32 arithmetic before the one rounding: at most one ulp of dtype from the float64 value
        ulp = torch.finfo(dtype).eps * want.float().abs().clamp(min=torch.finfo(dtype).tiny)
        assert ((x.grad.float() - want.float()).abs() <= ulp).all()
        assert (x.grad == want).float().mean() > 0.97


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_unreduced_gradient_rounded_once_on_every_tier(cpu_tier, dtype):
    check_unreduced_gradient_rounded_once(dtype, "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_unreduced_gradient_rounded_once_on_every_backend(backend, dtype):
    check_unreduced_gradient_rounded_once(dtype, backend.device)


def check_one_class_smoothing_gradient_is_zero(device):
    """Issue 31: with one class the softmax is exactly 1 and the smoothed target is exactly 1, so
    the gradient is exactly 0 (it was 1.6e-8 for bf16 logits: 1 - eps rounded twice)."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        logits = torch.randn(9, 1).to(device=device, dtype=dtype)
        target = torch.zeros(9, dtype=torch.long, device=device)
        for eps in (0.1, 0.3, 1 / 3):
            for reduction in ("mean", "none"):
                loss, grad = run_fused(logits, target, label_smoothing=eps, reduction=reduction)
                assert torch.equal(grad, torch.zeros_like(grad)), (dtype, eps, reduction)
                assert torch.equal(loss, torch.zeros_like(loss)), (dtype, eps, reduction)


def check_smoothing_over_the_largest_logits_stays_finite(device):
    """Issue 31: logits [1e30, 1e30, 3e38] with label smoothing: the mean deviation from the max is
    -2e38, finite, though the deviations sum to -6e38, past fp32's range; the loss is the exact
    2.0e37 (eps 0.1), not inf."""
    x = torch.tensor([[1e30, 1e30, 3e38], [3e38, 1e30, -1e30]], device=device)
    target = torch.tensor([2, 0], device=device)
    want = float64_loss(x, target, 0.1)
    assert torch.isfinite(want).all()
    for got in (te.kernels.cross_entropy(x, target, label_smoothing=0.1, reduction="none"),
                reference.cross_entropy_fwd(x, target, 0.1, -100, False)[0]):
        assert torch.isfinite(got).all()
        assert_close(got.double(), want, rtol=1e-5)


def test_one_class_smoothing_gradient_is_zero(cpu_tier):
    check_one_class_smoothing_gradient_is_zero("cpu")


def test_one_class_smoothing_gradient_is_zero_on_every_backend(backend):
    check_one_class_smoothing_gradient_is_zero(backend.device)


def test_smoothing_over_the_largest_logits_stays_finite(cpu_tier):
    check_smoothing_over_the_largest_logits_stays_finite("cpu")


def test_smoothing_over_the_largest_logits_stays_finite_on_every_backend(backend):
    check_smoothing_over_the_largest_logits_stays_finite(backend.device)


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("cross_entropy")


def _logits(d):
    return randn(d, 5, 70, scale=3.0), torch.tensor([0, 69, 3, -100, 12], device=d)


@CASES.case("cross_entropy_fwd")
def _(d):
    logits, target = _logits(d)
    return (logits, target, 0.1, -100, True, None), ()


@CASES.case("cross_entropy_bwd")
def _(d):
    logits, target = _logits(d)
    _, grad = ops.cross_entropy_fwd(logits, target, 0.1, -100, True, None)
    return (grad, torch.rand(5, device=d)), ()


@CASES.case("cross_entropy_partials")
def _(d):
    logits, target = _logits(d)
    return (logits[:, 35:].contiguous(), target, 35, -100), ()


@CASES.case("cross_entropy_sharded_grad")
def _(d):
    logits, target = _logits(d)
    return (logits[:, 35:].contiguous(), target, 35, torch.zeros(5, device=d), torch.full((5,), 70.0, device=d),
            0.1, 70, -100, torch.ones(5, device=d)), ()


# Cross entropy: fp32 [6, 33] with an ignored token, with and without the gradient in the
# forward (logits with grad where it is), no grad_scale, a 0-d one and one per token.
def _ce_inputs(d):
    logits = randn(d, 6, 33, dtype=F32, scale=3.0)
    return logits, torch.tensor([3, -100, 0, 32, 17, 5], device=d)


for _compute_grad in (True, False):
    for _scale_kind in ("no grad_scale", "0-d grad_scale", "grad_scale per token"):
        @CASES.case(f"cross_entropy_fwd[fp32, compute_grad={_compute_grad}, {_scale_kind}]", compile=False)
        def _(d, compute_grad=_compute_grad, scale_kind=_scale_kind):
            logits, target = _ce_inputs(d)
            grad_scale = {"no grad_scale": None, "0-d grad_scale": torch.tensor(0.25, device=d),
                          "grad_scale per token": torch.rand(6, device=d)}[scale_kind]
            return (logits.requires_grad_(compute_grad), target, 0.1, -100, compute_grad, grad_scale), ()


@CASES.case("cross_entropy_bwd[fp32]", compile=False)
def _(d):
    logits, target = _ce_inputs(d)
    _, grad = ops.cross_entropy_fwd(logits, target, 0.1, -100, True, None)
    return (grad, torch.randn(6, device=d)), ()


@CASES.case("cross_entropy_partials[bf16, whole vocabulary]", compile=False)
def _(d):
    logits = randn(d, 6, 96, scale=4.0)
    return (logits, torch.tensor([3, -100, 0, 95, 40, 7], device=d), 0, -100), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
