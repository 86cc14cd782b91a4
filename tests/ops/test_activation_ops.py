"""Activation ops (plain and gated, with the fused bias and bias gradient, and the fused FP8
cast): kernels against the reference and against PyTorch's autograd in fp64, on every CPU
SIMD tier and every backend (tests/helpers/backends.py: the Triton kernels too), odd shapes, zero
rows, non-contiguous views; the vectorised sigmoid and gelu against torch over a wide range;
FP8 codes bit-exact against the unfused path; argument errors (opcheck and torch.compile of
the ops: the op cases at the end)."""
import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.triton import triton_status
from backends import assert_refused
from numerics import assert_close, assert_same_fp8, assert_two_reference, sqnr_db
from op_cases import BF16, E4M3, F32, OpCases, basic_inputs, dtype_name, randn

ops = torch.ops.portable_te
PLAIN = ["gelu", "qgelu", "relu", "srelu", "silu"]
GATED = ["glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu"]
KINDS = PLAIN + GATED
# Odd sizes (vector bodies plus scalar tails, rows of any length), several dbias chunks, zero rows.
SHAPES = [(3, 37, 70), (129, 520), (1, 2), (2, 0, 64)]


def torch_activation(kind, x, limit=7.0, alpha=1.702):
    """The activation from PyTorch's own functions: the independent oracle for autograd."""
    gelu = lambda v: F.gelu(v, approximate="tanh")  # noqa: E731
    qgelu = lambda v: v * torch.sigmoid(1.702 * v)  # noqa: E731
    srelu = lambda v: F.relu(v).square()  # noqa: E731
    plain = {"gelu": gelu, "qgelu": qgelu, "relu": F.relu, "srelu": srelu, "silu": F.silu}
    if kind in plain:
        return plain[kind](x)
    a, b = x.chunk(2, dim=-1)
    if kind == "clamped_swiglu":
        a, b = a.clamp(max=limit), b.clamp(-limit, limit) + 1
        return a * torch.sigmoid(alpha * a) * b
    gate = {"glu": torch.sigmoid, "geglu": gelu, "qgeglu": qgelu, "reglu": F.relu, "sreglu": srelu,
            "swiglu": F.silu}[kind]
    return gate(a) * b


def make_inputs(kind, shape, dtype, with_bias, device="cpu"):
    x = (torch.randn(shape) * 3).to(device=device, dtype=dtype)
    bias = (torch.randn(shape[-1])).to(device=device, dtype=dtype) if with_bias else None
    out_shape = (*shape[:-1], shape[-1] // 2) if kind in GATED else shape
    dy = torch.randn(out_shape).to(device=device, dtype=dtype)
    return x, bias, dy


def run(fn, x, bias, dy):
    """Forward and the gradients of x (and bias) through autograd."""
    x = x.detach().requires_grad_()
    bias = bias.detach().requires_grad_() if bias is not None else None
    y = fn(x, bias)
    y.backward(dy)
    return y, x.grad, (bias.grad if bias is not None else None)


def ours(kind):
    return lambda x, bias: getattr(te.kernels, kind)(x, bias)


def plain_pytorch(kind, dtype):
    """The activation in PyTorch with autograd, computed in `dtype` (bias added in it too)."""
    def fn(x, bias):
        x = x.to(dtype)
        return torch_activation(kind, x + bias.to(dtype) if bias is not None else x)
    return fn


def check_against_reference(kind, with_bias, dtype, device="cpu"):
    # 1 - tanh^2 and sigmoid's 1 - s lose their relative accuracy where they are tiny, by an
    # fp32 ulp of 1 times |x| |b| |dy| in the gradients: there the kernel and the reference
    # (torch's tanh and exp) differ by more than the default atol, at the gradient's scale.
    for shape in SHAPES:
        x, bias, dy = make_inputs(kind, shape, dtype, with_bias, device)
        grad_scale = float(dy.abs().amax()) * float(x.float().abs().amax()) ** 2 if x.numel() else 0.0
        grad_tol = {"atol": max(1e-7 * grad_scale, 1e-5)}
        y, dx, dbias = run(ours(kind), x, bias, dy)
        assert y.dtype == dtype and dx.dtype == dtype
        assert_close(y, reference.activation_fwd(x, bias, kind), name=f"{kind} {shape} output")
        if with_bias:
            want_dx, want_dbias = reference.activation_bwd_dbias(dy, x, bias, kind)
            # grad_bias sums over rows: allow fp32 summation-order differences.
            assert_close(dbias, want_dbias, name=f"{kind} {shape} grad_bias", atol=1e-4 * max(1, x.numel()) ** 0.5)
        else:
            want_dx = reference.activation_bwd(dy, x, None, kind)
        assert_close(dx, want_dx, name=f"{kind} {shape} grad_input", **grad_tol)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_reference_on_every_tier(cpu_tier, kind, with_bias, dtype):
    check_against_reference(kind, with_bias, dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_reference_on_every_backend(backend, kind, with_bias, dtype):
    check_against_reference(kind, with_bias, dtype, backend.device)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_against_pytorch_autograd_in_float64(backend, kind, dtype):
    """Independent oracle: PyTorch's functions and autograd in fp64. Low precision follows the
    two-reference rule (error at most 2x forward / 3x backward that of PyTorch in bf16)."""
    x, bias, dy = make_inputs(kind, (64, 130), dtype, with_bias=True, device=backend.device)
    got = run(ours(kind), x, bias, dy)
    exact = run(plain_pytorch(kind, torch.float64), x, bias, dy)
    names = ("output", "grad_input", "grad_bias")
    if dtype == torch.float32:
        for name, g, e in zip(names, got, exact):
            assert_close(g, e, dtype=torch.float32, name=f"{kind} {name}", rtol=1e-5, atol=1e-4)
        return
    plain = run(plain_pytorch(kind, dtype), x, bias, dy)
    for name, g, p, e, factor in zip(names, got, plain, exact, (2, 3, 3)):
        assert_two_reference(g, p, e, factor, name=f"{kind} {name}")


def test_clamped_swiglu_limit_and_alpha(backend):
    x, bias, dy = make_inputs("clamped_swiglu", (16, 96), torch.float32, with_bias=True, device=backend.device)
    fn = lambda x, b: te.kernels.clamped_swiglu(x, b, limit=1.5, alpha=0.8)  # noqa: E731
    exact = run(lambda x, b: torch_activation("clamped_swiglu", (x + b).double(), 1.5, 0.8), x, bias, dy)
    for name, g, e in zip(("output", "grad_input", "grad_bias"), run(fn, x, bias, dy), exact):
        assert_close(g, e, dtype=torch.float32, name=name, rtol=1e-5, atol=1e-4)


def test_sigmoid_is_accurate_and_saturates_over_a_wide_range(cpu_tier):
    """glu(a, 1) = sigmoid(a): the vectorised exp-based sigmoid within a few ulp of torch's in
    fp32, exactly 0 and 1 far out, never NaN."""
    a = torch.cat([torch.linspace(-30, 30, 6001), torch.tensor([-1e30, -1e4, -200.0, -88.0, 88.0, 200.0, 1e4, 1e30,
                                                                 float("-inf"), float("inf")])])
    got = te.kernels.glu(torch.cat([a, torch.ones_like(a)]).unsqueeze(0))[0]  # one row: the vector path
    want = torch.sigmoid(a)
    assert not got.isnan().any()
    ulp = torch.finfo(torch.float32).eps
    assert_close(got, want, rtol=6 * ulp, atol=1e-37)
    assert torch.equal(got[a <= -200], torch.zeros_like(got[a <= -200]))
    assert torch.equal(got[a >= 88], torch.ones_like(got[a >= 88]))


def test_gelu_tanh_is_accurate_over_a_wide_range(cpu_tier):
    """gelu as x * sigmoid(2u): fp32 gelu no further from fp64 PyTorch than PyTorch's own fp32
    gelu (plus an ulp); far out sigmoid(2u) is exactly 1 or 0, so gelu(x) = x on the right and 0 on the
    left, with no NaN or inf."""
    x = torch.linspace(-12, 12, 24001)
    got = te.kernels.gelu(x)
    exact = F.gelu(x.double(), approximate="tanh")
    assert_two_reference(got, F.gelu(x, approximate="tanh"), exact, factor=2, name="gelu")
    far = torch.tensor([-1e30, -1e4, -100.0, 100.0, 1e4, 1e30])
    got_far = te.kernels.gelu(far.repeat(8))  # whole vectors
    assert torch.equal(got_far, torch.where(far > 0, far, 0.0).repeat(8))


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_non_contiguous_input(backend, kind):
    base = torch.randn(70, 48, device=backend.device)
    for view in (base.t(), base[::2, :]):
        assert not view.is_contiguous()
        bias = torch.randn(view.shape[-1], device=backend.device)
        dy = torch.randn(te.kernels.activation(view, kind).shape, device=backend.device)
        got, want = run(ours(kind), view, bias, dy), run(ours(kind), view.contiguous(), bias, dy)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


@pytest.mark.parametrize("kind", ["gelu"])
def test_large_tensors_use_streaming_stores_correctly(kind):
    # [2048, 8192] bf16 is 32 MiB: the output, dx and the FP8 codes take the streaming paths.
    x, bias, dy = make_inputs(kind, (2048, 8192), torch.bfloat16, with_bias=False)
    y, dx, _ = run(ours(kind), x, bias, dy)
    assert_close(y, reference.activation_fwd(x, None, kind), name="output")
    assert_close(dx, reference.activation_bwd(dy, x, None, kind), name="grad_input")
    scale = torch.tensor([4.0])
    data, amax = te.kernels.activation_fp8(x, kind, scale, torch.float8_e4m3fn)
    want_data, want_amax = te.kernels.fp8_quantize(y, scale, torch.float8_e4m3fn)
    assert_same_fp8(data, want_data)
    assert torch.equal(amax, want_amax)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_is_bit_exact_against_the_unfused_path(backend, kind, dtype, fp8_dtype):
    """Codes and amax equal fp8_quantize(activation(x)), bit for bit, saturation included."""
    for shape, with_bias in (((3, 37, 70), True), ((65, 520), False), ((2, 0, 64), True)):
        x, bias, _ = make_inputs(kind, shape, dtype, with_bias, backend.device)
        scale = torch.tensor([30.0], device=backend.device)  # saturates part of the output
        data, amax = te.kernels.activation_fp8(x, kind, scale, fp8_dtype, bias=bias)
        want_data, want_amax = te.kernels.fp8_quantize(te.kernels.activation(x, kind, bias), scale, fp8_dtype)
        assert_same_fp8(data, want_data)
        assert torch.equal(amax, want_amax)


def unfused_backward_fp8(dy, x, kind, scale, fp8_dtype):
    """What activation_grad_fp8 fuses: activation_bwd, then the cast with its transpose."""
    return te.kernels.fp8_quantize_transpose(ops.activation_bwd(dy, x, None, kind, 7.0, 1.702), scale, fp8_dtype)


# Odd rows and columns (vector bodies and tails, several tiles of 128 rows and panels of 128
# columns, a last panel one column wide), 3-D input, one element, zero rows.
BACKWARD_FP8_SHAPES = [(3, 37, 70), (300, 258), (130, 514), (1, 2), (2, 0, 64)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_backward_fp8_is_bit_exact_against_the_unfused_path(cpu_tier, kind, dtype, fp8_dtype):
    """The input gradient's codes, their transpose and amax equal those of fp8_quantize_transpose
    of activation_bwd's output, bit for bit, saturation included, on every SIMD tier."""
    for shape in BACKWARD_FP8_SHAPES:
        x, _, dy = make_inputs(kind, shape, dtype, with_bias=False)
        scale = torch.tensor([30.0 if dtype != torch.float16 else 3.0])  # saturates part of the gradient
        data, data_t, amax = te.kernels.activation_grad_fp8(dy, x, kind, scale, fp8_dtype, with_transpose=True)
        want_data, want_t, want_amax = unfused_backward_fp8(dy, x, kind, scale, fp8_dtype)
        assert_same_fp8(data, want_data)
        assert_same_fp8(data_t, want_t)
        assert torch.equal(amax, want_amax), (shape, amax, want_amax)
        rowwise, no_transpose, same_amax = te.kernels.activation_grad_fp8(dy, x, kind, scale, fp8_dtype, False)
        assert no_transpose is None and torch.equal(same_amax, want_amax)
        assert_same_fp8(rowwise, want_data)


def test_backward_fp8_skips_nan_in_the_amax_and_is_independent_of_threads():
    """A NaN gradient element is a NaN code that stays out of the amax (fmaxf), and the codes
    and amax are the same whatever the number of threads."""
    x, _, dy = make_inputs("swiglu", (257, 1030), torch.bfloat16, with_bias=False)
    dy[5, 7] = float("nan")
    scale = torch.tensor([4.0])
    data, data_t, amax = te.kernels.activation_grad_fp8(dy, x, "swiglu", scale, torch.float8_e5m2, True)
    assert torch.isnan(data[5, 7].float()) and torch.isnan(data[5, 7 + 515].float())
    assert torch.isfinite(amax)
    want_data, want_t, want_amax = unfused_backward_fp8(dy, x, "swiglu", scale, torch.float8_e5m2)
    assert_same_fp8(data, want_data)
    assert_same_fp8(data_t, want_t)
    assert torch.equal(amax, want_amax)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = te.kernels.activation_grad_fp8(dy, x, "swiglu", scale, torch.float8_e5m2, True)
    finally:
        torch.set_num_threads(threads)
    assert_same_fp8(alone[0], data)
    assert_same_fp8(alone[1], data_t)
    assert torch.equal(alone[2], amax)


@pytest.mark.parametrize("with_transpose", [True, False])
def test_backward_fp8_on_accelerators_composes_the_two_ops(with_transpose):
    """What accelerators run (no fused kernel there yet): activation_bwd, then the cast, through
    the dispatcher; the fused op's results exactly (here on the CPU's kernels)."""
    from transformer_engine.pytorch.custom_ops.activation import _composed_bwd_fp8
    x, _, dy = make_inputs("swiglu", (33, 258), torch.bfloat16, with_bias=False)
    scale = torch.tensor([2.0])
    got = _composed_bwd_fp8(dy, x, "swiglu", 7.0, 1.702, scale, torch.float8_e5m2, with_transpose)
    want = ops.activation_bwd_fp8(dy, x, "swiglu", 7.0, 1.702, scale, torch.float8_e5m2, with_transpose)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g.view(torch.uint8) if g.dtype != torch.float32 else g,
                                                  w.view(torch.uint8) if w.dtype != torch.float32 else w)


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_backward_fp8_on_every_backend(backend, kind):
    """The op on each backend (on accelerators the composition of its two passes) against the
    reference, and the codes against the exact gradient."""
    x, _, dy = make_inputs(kind, (33, 258), torch.bfloat16, with_bias=False, device=backend.device)
    scale = torch.tensor([2.0], device=backend.device)
    data, data_t, amax = te.kernels.activation_grad_fp8(dy, x, kind, scale, torch.float8_e5m2, True)
    want_data, want_t, want_amax = reference.activation_bwd_fp8(dy, x, kind, 7.0, 1.702, scale, torch.float8_e5m2,
                                                               True)
    assert_close(data.float(), want_data.float(), dtype=torch.float8_e5m2, name="codes")
    assert torch.equal(data_t.view(torch.uint8), data.view(torch.uint8).t())
    assert_close(amax, want_amax, dtype=torch.bfloat16, name="amax")
    x64 = x.double().requires_grad_()
    torch_activation(kind, x64).backward(dy.double())
    assert sqnr_db((x64.grad * 2.0).cpu(), data.double().cpu()) >= 20


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "clamped_swiglu"])
@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fp8_matches_reference(backend, kind, fp8_dtype):
    x, bias, _ = make_inputs(kind, (33, 258), torch.bfloat16, with_bias=True, device=backend.device)
    scale = torch.tensor([2.0], device=backend.device)
    data, amax = te.kernels.activation_fp8(x, kind, scale, fp8_dtype, bias=bias)
    want_data, want_amax = reference.activation_fp8(x, bias, kind, 7.0, 1.702, scale, fp8_dtype)
    assert_close(data.float(), want_data.float(), dtype=fp8_dtype, name="codes")
    assert_close(amax, want_amax, dtype=torch.bfloat16, name="amax")
    exact = torch_activation(kind, x.double() + bias.double()) * 2.0
    assert sqnr_db(exact.cpu(), data.double().cpu()) >= 25


def test_bias_without_grad_uses_the_plain_backward(backend):
    x, bias, dy = make_inputs("gelu", (5, 40), torch.float32, with_bias=True, device=backend.device)
    x.requires_grad_()
    te.kernels.gelu(x, bias).backward(dy)
    assert_close(x.grad, reference.activation_bwd(dy, x.detach(), bias, "gelu"), name="grad_input")
    assert bias.grad is None


def test_double_backward_raises_instead_of_silently_dropping_terms(backend):
    x = torch.randn(4, 16, device=backend.device, requires_grad=True)
    (grad_x,) = torch.autograd.grad(te.kernels.gelu(x).square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_x.sum().backward()


def test_meta_tensors_use_the_fake_kernel():
    x = torch.empty(4, 7, 32, device="meta", dtype=torch.bfloat16)
    assert ops.activation_fwd(x, None, "swiglu", 7.0, 1.702).shape == (4, 7, 16)
    data, amax = ops.activation_fp8(x, None, "gelu", 7.0, 1.702, torch.empty(1, device="meta"), torch.float8_e5m2)
    assert data.shape == (4, 7, 32) and data.dtype == torch.float8_e5m2 and amax.dtype == torch.float32
    data, data_t, amax = ops.activation_bwd_fp8(torch.empty(4, 7, 16, device="meta", dtype=torch.bfloat16), x,
                                                "swiglu", 7.0, 1.702, torch.empty(1, device="meta"),
                                                torch.float8_e5m2, True)
    assert data.shape == (4, 7, 32) and data_t.shape == (32, 28) and data.dtype == data_t.dtype == torch.float8_e5m2


def test_build_info_reports_the_kernels():
    info = te.build_info()
    gpu_path = "triton" if triton_status()[0] else "reference"  # the Triton kernels, when triton is installed
    for name in ("activation_fwd", "activation_bwd", "activation_bwd_dbias", "activation_fp8"):
        assert info["ops"][name] == {"cpu": "kernel", "cuda": gpu_path, "musa": gpu_path}
    # On accelerators its two passes' own kernels, composed.
    assert info["ops"]["activation_bwd_fp8"] == {"cpu": "kernel", "cuda": "reference", "musa": "reference"}


# --- bad input: a ValueError naming the argument and the sizes -------------------------------

def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize("call, words", [
    (lambda: te.kernels.swiglu(_x(4, 7)), ["input", "even", "[4, 7]"]),
    (lambda: te.kernels.activation_fp8(_x(4, 7), "geglu", torch.ones(1), torch.float8_e4m3fn), ["input", "[4, 7]"]),
    (lambda: te.kernels.gelu(_x(4, 8), _x(7)), ["bias", "[7]", "[8]"]),
    (lambda: te.kernels.gelu(_x(4, 8), _x(8, dtype=torch.bfloat16)), ["bias", "BFloat16", "Float"]),
    (lambda: te.kernels.gelu(_x(4, 8), torch.ones(8, device="meta")), ["bias", "meta", "cpu"]),
    (lambda: te.kernels.activation(_x(4, 8), "tanhh"), ["activation", "tanhh", "swiglu"]),
    (lambda: te.kernels.gelu(torch.ones(4, 8, dtype=torch.int64)), ["input", "Long"]),
    (lambda: te.kernels.gelu(_x(4, 8, dtype=torch.float64)), ["input", "Double"]),
    (lambda: te.kernels.gelu(torch.tensor(1.0)), ["input", "0-d"]),
    (lambda: te.kernels.clamped_swiglu(_x(4, 8), limit=-1.0), ["limit", "-1"]),
    (lambda: ops.activation_bwd(_x(4, 8), _x(4, 8), None, "swiglu", 7.0, 1.702), ["grad_output", "[4, 8]", "[4, 4]"]),
    (lambda: ops.activation_bwd_dbias(_x(4, 8), _x(4, 8), _x(3), "gelu", 7.0, 1.702), ["bias", "[3]"]),
    (lambda: ops.activation_bwd(_x(4, 8, dtype=torch.bfloat16), _x(4, 8), None, "gelu", 7.0, 1.702),
     ["grad_output", "BFloat16"]),
    (lambda: te.kernels.activation_fp8(_x(4, 8), "gelu", torch.ones(2), torch.float8_e4m3fn), ["scale", "[2]"]),
    (lambda: te.kernels.activation_grad_fp8(_x(4, 9), _x(4, 16), "swiglu", torch.ones(1), torch.float8_e5m2, True),
     ["grad_output", "[4, 9]", "[4, 8]"]),
    (lambda: te.kernels.activation_grad_fp8(_x(4, 8), _x(4, 8), "gelu", torch.ones(3), torch.float8_e5m2, True),
     ["scale", "[3]"]),
    (lambda: te.kernels.activation_grad_fp8(_x(4, 8), _x(4, 8), "gelu", torch.ones(1), torch.bfloat16, True),
     ["fp8_dtype", "BFloat16"]),
    (lambda: te.kernels.activation_fp8(_x(4, 8), "gelu", torch.ones(1), torch.float16), ["fp8_dtype", "Half"]),
    (lambda: te.kernels.activation_fp8(_x(4, 8), "gelu", torch.ones(1, dtype=torch.float64), torch.float8_e4m3fn),
     ["scale", "Double", "Float"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error_naming_argument(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python,
    custom_ops/activation.py), and in the fake kernels torch.compile traces with."""
    assert_refused(backend, call, words)


@pytest.mark.parametrize("activation, shape, with_bias", [("gelu", (64, 128), True), ("swiglu", (64, 256), False)])
def test_bench_cases_compute_the_same_as_eager(activation, shape, with_bias):
    from transformer_engine.bench import activation_cases
    case = activation_cases.activation_case(activation, shape, with_bias, torch.float32, "full", torch.device("cpu"))
    for got, want in zip(case.providers["ours"](), case.providers["eager"]()):
        assert_close(got, want, rtol=1e-5, atol=1e-4)
    fp8_case = activation_cases.activation_fp8_case(activation, shape, torch.bfloat16, torch.device("cpu"))
    got, want = fp8_case.providers["ours"]()[0], fp8_case.providers["eager"]()[0]
    assert_close(got.float(), want.float(), dtype=got.dtype)


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "clamped_swiglu"])
def test_float16(backend, kind):
    x, bias, dy = make_inputs(kind, (3, 37, 70), torch.float16, with_bias=True, device=backend.device)
    y, dx, dbias = run(ours(kind), x, bias, dy)
    want_dx, want_dbias = reference.activation_bwd_dbias(dy, x, bias, kind)
    assert_close(y, reference.activation_fwd(x, bias, kind), name="output")
    assert_close(dx, want_dx, name="grad_input", atol=1e-3)
    assert_close(dbias, want_dbias, name="grad_bias", atol=1e-2)


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("activation")


@CASES.case("activation_fwd")
def _(d):
    x, _, b, _ = basic_inputs(d)
    return (x, b.bfloat16(), "swiglu", 7.0, 1.702), ()


@CASES.case("activation_bwd")
def _(d):
    x, _, b, _ = basic_inputs(d)
    return (x[:, :48].contiguous(), x, b.bfloat16(), "geglu", 7.0, 1.702), ()


@CASES.case("activation_bwd_dbias")
def _(d):
    x, _, b, dy = basic_inputs(d)
    return (dy, x, b.bfloat16(), "gelu", 7.0, 1.702), ()


@CASES.case("activation_fp8")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (x, None, "silu", 7.0, 1.702, torch.tensor([3.0], device=d), E4M3), (0,)


@CASES.case("activation_bwd_fp8")
def _(d):
    x, _, _, _ = basic_inputs(d)
    return (x[:, :48].contiguous(), x, "swiglu", 7.0, 1.702, torch.tensor([3.0], device=d), E4M3, True), (0, 1)


# Activations: [4, 3, 40] (x * 3) with a bias of x's dtype; a plain and a gated kind, fp32 and
# bf16; the forwards with grad (torch.compile: the fp32 ones, forward and backward).
def _activation_inputs(d, kind, dtype, grad):
    x = randn(d, 4, 3, 40, dtype=dtype, scale=3.0, grad=grad)
    bias = randn(d, 40, dtype=dtype, grad=grad)
    dy = randn(d, 4, 3, 20 if kind.endswith("glu") else 40, dtype=dtype)
    return x, bias, dy


for _kind, _dtype in (("gelu", F32), ("clamped_swiglu", BF16), ("swiglu", F32)):
    _t, _fp32 = f"{_kind}, {dtype_name(_dtype)}", _dtype == F32

    @CASES.case(f"activation_fwd[{_t}, bias]", compile=_fp32)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, _ = _activation_inputs(d, kind, dtype, grad=True)
        return (x, bias, kind, 7.0, 1.702), ()

    if _kind == "swiglu":  # compiled only
        continue

    @CASES.case(f"activation_fwd[{_t}, no bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, _, _ = _activation_inputs(d, kind, dtype, grad=True)
        return (x, None, kind, 7.0, 1.702), ()

    @CASES.case(f"activation_bwd[{_t}, bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, dy = _activation_inputs(d, kind, dtype, grad=False)
        return (dy, x, bias, kind, 7.0, 1.702), ()

    @CASES.case(f"activation_bwd[{_t}, no bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, _, dy = _activation_inputs(d, kind, dtype, grad=False)
        return (dy, x, None, kind, 7.0, 1.702), ()

    @CASES.case(f"activation_bwd_dbias[{_t}]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, dy = _activation_inputs(d, kind, dtype, grad=False)
        return (dy, x, bias, kind, 7.0, 1.702), ()

    @CASES.case(f"activation_fp8[{_t}, bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, _ = _activation_inputs(d, kind, dtype, grad=False)
        return (x, bias, kind, 7.0, 1.702, torch.tensor([2.0], device=d), E4M3), (0,)


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
