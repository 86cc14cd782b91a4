"""LayerNorm/RMSNorm ops: kernels against the reference and against PyTorch in fp64,
on every CPU SIMD tier, odd shapes, zero rows, non-contiguous views, mixed parameter dtypes;
plus gradcheck and argument errors (opcheck and torch.compile of the ops: the op cases at the end)."""
import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.pytorch.triton import triton_status
from transformer_engine.pytorch import reference
from backends import assert_refused
from numerics import assert_close, assert_two_reference
from op_cases import BF16, E4M3, E5M2, F32, OpCases, basic_inputs, dtype_name, randn

ops = torch.ops.portable_te
SHAPES = [(1, 1), (3, 37, 69), (5, 17), (2, 3, 1000), (33, 4096), (0, 64), (4, 0, 32)]
LOW_PRECISION = [torch.bfloat16, torch.float16]


def make_inputs(kind, shape, dtype, weight_dtype, device="cpu", zero_centered=False, with_bias=True):
    hidden = shape[-1]
    x = (torch.randn(shape, dtype=torch.float32) * 2 + 0.5).to(device=device, dtype=dtype)
    weight = (torch.randn(hidden) * 0.3 + (0.0 if zero_centered else 1.0)).to(device=device, dtype=weight_dtype)
    bias = torch.randn(hidden).to(device=device, dtype=weight_dtype) if kind == "layernorm" and with_bias else None
    dy = torch.randn(shape, dtype=torch.float32).to(device=device, dtype=dtype)
    return x, weight, bias, dy


def run_fused(kind, x, weight, bias, eps, zero_centered, dy):
    """Forward and all gradients through te.kernels (the autograd rule over the fused ops)."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    bias = bias.detach().requires_grad_() if bias is not None else None
    if kind == "layernorm":
        y = te.kernels.layernorm(x, weight, bias, eps, zero_centered)
    else:
        y = te.kernels.rmsnorm(x, weight, eps, zero_centered)
    y.backward(dy)
    return y, x.grad, weight.grad, (bias.grad if bias is not None else None)


def run_reference(kind, x, weight, bias, eps, zero_centered, dy):
    if kind == "layernorm":
        y, mean, rstd = reference.layernorm_fwd(x, weight, bias, eps, zero_centered)
        dx, dw, db = reference.layernorm_bwd(dy, x, mean, rstd, weight, zero_centered)
        return y, dx, dw, (db if bias is not None else None)
    y, rstd = reference.rmsnorm_fwd(x, weight, eps, zero_centered)
    dx, dw = reference.rmsnorm_bwd(dy, x, rstd, weight, zero_centered)
    return y, dx, dw, None


def run_torch(kind, x, weight, bias, eps, zero_centered, dy, dtype):
    """PyTorch's own layer_norm / rms_norm with autograd, computed in `dtype`."""
    x = x.detach().to(dtype).requires_grad_()
    weight = weight.detach().to(dtype).requires_grad_()
    bias = bias.detach().to(dtype).requires_grad_() if bias is not None else None
    gamma = weight + 1 if zero_centered else weight
    if kind == "layernorm":
        y = F.layer_norm(x, x.shape[-1:], gamma, bias, eps)
    else:
        y = F.rms_norm(x, x.shape[-1:], gamma, eps)
    y.backward(dy.to(dtype))
    return y, x.grad, weight.grad, (bias.grad if bias is not None else None)


def check_against_reference(kind, shape, dtype, weight_dtype, zero_centered, with_bias=True, eps=1e-5,
                            device="cpu"):
    x, weight, bias, dy = make_inputs(kind, shape, dtype, weight_dtype, device, zero_centered=zero_centered,
                                      with_bias=with_bias)
    got = run_fused(kind, x, weight, bias, eps, zero_centered, dy)
    want = run_reference(kind, x, weight, bias, eps, zero_centered, dy)
    for name, g, w in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, want):
        if w is None:
            assert g is None, name
            continue
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != {w.dtype}"
        # Parameter gradients sum over rows: allow fp32 summation-order differences.
        extra = {"atol": 1e-4 * max(1, shape[0]) ** 0.5} if name in ("grad_weight", "grad_bias") else {}
        assert_close(g, w, name=f"{kind} {name}", **extra)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_reference_on_every_tier(cpu_tier, kind, shape, dtype):
    check_against_reference(kind, shape, dtype, dtype, zero_centered=False)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_reference_on_every_backend(backend, kind, shape, dtype):
    check_against_reference(kind, shape, dtype, dtype, zero_centered=False, device=backend.device)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mixed_parameter_dtype_and_zero_centered_gamma(backend, kind, zero_centered, weight_dtype):
    check_against_reference(kind, (6, 7, 333), torch.bfloat16, weight_dtype, zero_centered, device=backend.device)


def test_layernorm_without_bias(backend):
    check_against_reference("layernorm", (9, 130), torch.float32, torch.float32, False, with_bias=False,
                            device=backend.device)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_large_bf16_rows_use_streaming_stores_correctly(kind):
    # [8192, 4096] bf16 is 64 MiB: above the streaming-store threshold, so this covers that path.
    check_against_reference(kind, (8192, 4096), torch.bfloat16, torch.bfloat16, zero_centered=False)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, *LOW_PRECISION], ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_against_pytorch_in_float64(backend, kind, dtype, zero_centered):
    """Independent oracle: PyTorch's autograd in fp64. Low precision follows the two-reference
    rule (error at most 2x forward / 3x backward that of PyTorch in the same dtype)."""
    x, weight, bias, dy = make_inputs(kind, (64, 515), dtype, dtype, backend.device, zero_centered=zero_centered)
    eps = 1e-5
    ours = run_fused(kind, x, weight, bias, eps, zero_centered, dy)
    exact = run_torch(kind, x, weight, bias, eps, zero_centered, dy, torch.float64)
    if dtype == torch.float32:
        for name, o, e in zip(("output", "grad_input", "grad_weight", "grad_bias"), ours, exact):
            if e is not None:
                assert_close(o, e, name=name, rtol=1e-5, atol=1e-4)
        return
    plain = run_torch(kind, x, weight, bias, eps, zero_centered, dy, dtype)
    for name, o, p, e, factor in zip(("output", "grad_input", "grad_weight", "grad_bias"), ours, plain, exact,
                                     (2, 3, 3, 3)):
        if e is not None:
            assert_two_reference(o, p, e, factor, name=f"{kind} {dtype} {name}")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_large_mean_keeps_precision(kind):
    """Rows far from zero: the two-pass variance must not cancel (fp32 data, mean 1e4, std 1)."""
    x = torch.randn(16, 1024, dtype=torch.float64) + 1e4
    weight = torch.ones(1024, dtype=torch.float32)
    y = te.kernels.layernorm(x.float(), weight) if kind == "layernorm" else te.kernels.rmsnorm(x.float(), weight)
    exact = run_torch(kind, x.float().double(), weight, None, 1e-5, False, torch.zeros_like(x), torch.float64)[0]
    assert_close(y, exact, name="output", rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_non_contiguous_input(backend, kind):
    base = torch.randn(70, 48, dtype=torch.float32, device=backend.device)
    x = base.t()  # [48, 70], strides (1, 48)
    x2 = base[::2, :]  # every other row
    for view in (x, x2):
        assert not view.is_contiguous()
        _, weight, bias, dy = make_inputs(kind, view.shape, torch.float32, torch.float32, backend.device)
        got = run_fused(kind, view, weight, bias, 1e-5, False, dy)
        want = run_fused(kind, view.contiguous(), weight, bias, 1e-5, False, dy)
        for g, w in zip(got, want):
            if w is not None:
                assert torch.equal(g, w)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_gradcheck_float64(kind):
    x, weight, bias, _ = make_inputs(kind, (3, 5, 11), torch.float64, torch.float64)
    x.requires_grad_(), weight.requires_grad_()
    if kind == "layernorm":
        bias.requires_grad_()
        assert torch.autograd.gradcheck(lambda a, w, b: te.kernels.layernorm(a, w, b, 1e-5, True), (x, weight, bias))
    else:
        assert torch.autograd.gradcheck(lambda a, w: te.kernels.rmsnorm(a, w, 1e-5, True), (x, weight))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_double_backward_raises_instead_of_silently_dropping_terms(kind):
    x, weight, bias, _ = make_inputs(kind, (4, 16), torch.float64, torch.float64)
    x.requires_grad_(), weight.requires_grad_()
    y = te.kernels.layernorm(x, weight, bias) if kind == "layernorm" else te.kernels.rmsnorm(x, weight)
    (grad_x,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_x.sum().backward()


def test_meta_tensors_use_the_fake_kernel():
    x = torch.empty(4, 7, 32, device="meta", dtype=torch.bfloat16)
    w = torch.empty(32, device="meta", dtype=torch.float32)
    y, mean, rstd = ops.layernorm_fwd(x, w, None, 1e-5, False)
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.device.type == "meta"
    assert mean.shape == (4, 7) and rstd.dtype == torch.float32


def test_build_info_reports_the_path_of_every_op():
    info = te.build_info()
    assert "cpu" in info["backends"]
    assert info["cpu_isa_active"] in ("portable", "avx2", "avx512", "amx")
    gpu_path = "triton" if triton_status()[0] else "reference"  # the Triton kernels, when triton is installed
    for name in ("layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "add_layernorm_fwd",
                 "add_rmsnorm_bwd", "layernorm_fp8_fwd"):
        assert info["ops"][name] == {"cpu": "kernel", "cuda": gpu_path, "musa": gpu_path}
    assert info["ops"]["scaled_gemm"]["cuda"] == "reference"  # the GEMM has no Triton kernel
    text = te.format_build_info(info)
    assert "layernorm_fwd" in text and f"GPU kernels: {triton_status()[1]}" in text


# --- bad input: a ValueError naming the argument and the sizes -------------------------------

def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize("call, words", [
    (lambda: ops.layernorm_fwd(_x(4, 8), _x(7), None, 1e-5, False), ["weight", "[7]", "[8]"]),
    (lambda: ops.layernorm_fwd(_x(4, 8), _x(2, 4), None, 1e-5, False), ["weight", "[2, 4]"]),
    (lambda: ops.layernorm_fwd(_x(4, 8), _x(8), _x(9), 1e-5, False), ["bias", "[9]"]),
    (lambda: ops.layernorm_fwd(_x(4, 8), _x(8), _x(8, dtype=torch.float64), 1e-5, False), ["bias", "Double"]),
    (lambda: ops.layernorm_fwd(torch.ones(4, 8, dtype=torch.int64), _x(8), None, 1e-5, False), ["input", "Long"]),
    (lambda: ops.layernorm_fwd(_x(4, 8), torch.ones(8, dtype=torch.int32), None, 1e-5, False), ["weight", "Int"]),
    (lambda: ops.layernorm_fwd(_x(4, 8), torch.ones(8, device="meta"), None, 1e-5, False), ["weight", "meta", "cpu"]),
    (lambda: ops.layernorm_fwd(torch.tensor(1.0), _x(1), None, 1e-5, False), ["input", "0-d"]),
    (lambda: ops.layernorm_fwd(_x(4, 0), _x(0), None, 1e-5, False), ["input", "[4, 0]"]),
    (lambda: ops.layernorm_fwd(_x(4, 8), _x(8), None, -1.0, False), ["eps", "-1"]),
    (lambda: ops.rmsnorm_fwd(_x(3, 5), _x(6), 1e-5, False), ["weight", "[6]", "[5]"]),
    (lambda: ops.rmsnorm_bwd(_x(3, 6), _x(3, 5), _x(3), _x(5), False), ["grad_output", "[3, 6]", "[3, 5]"]),
    (lambda: ops.rmsnorm_bwd(_x(3, 5), _x(3, 5), _x(4), _x(5), False), ["rstd", "[4]", "[3]"]),
    (lambda: ops.layernorm_bwd(_x(3, 5), _x(3, 5), _x(3, dtype=torch.float64), _x(3), _x(5), False),
     ["mean", "Double", "Float"]),
    (lambda: ops.layernorm_bwd(_x(3, 5, dtype=torch.bfloat16), _x(3, 5), _x(3), _x(3), _x(5), False),
     ["grad_output", "BFloat16"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error_naming_argument(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python, custom_ops/norm.py),
    and in the fake kernels torch.compile traces with."""
    assert_refused(backend, call, words)


def near_fp32_limit(cols=131):
    """fp32 rows whose float32 statistics overflow: the issue's two values of 3e38 among
    ordinary ones (a LayerNorm's sum overflows), rows of 1e20 to 1e36 (x^2 overflows from
    ~1.8e19), values of both signs near the limit; then two ordinary rows."""
    x = torch.randn(6, cols)
    x[0, 0] = x[0, cols - 1] = 3e38
    x[1] *= 1e20
    x[2] *= 1e36
    x[3, 5], x[3, 70] = 3e38, -3e38
    x[5] *= 1e-3
    return x


def float64_norm(kind, x, weight, bias, dy, eps=1e-5):
    """(y, dx, dweight, dbias, std per row) by PyTorch in float64."""
    y, dx, dw, db = run_torch(kind, x, weight, bias, eps, False, dy, torch.float64)
    wide = x.double()
    spread = wide.var(dim=-1, unbiased=False) if kind == "layernorm" else wide.square().mean(dim=-1)
    return y, dx, dw, db, (spread + eps).sqrt().unsqueeze(-1)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_rows_near_fp32_limit_stay_finite_and_exact(cpu_tier, kind):
    """Issue 18, item 8: forward and backward finite and within fp32 tolerance of float64
    torch (dx compared per row in units of 1 / std, where it is O(1))."""
    x = near_fp32_limit()
    weight = torch.rand(x.shape[-1]) + 0.5
    bias = torch.randn(x.shape[-1]) if kind == "layernorm" else None
    dy = torch.randn(x.shape)
    want_y, want_dx, want_dw, want_db, std = float64_norm(kind, x, weight, bias, dy)
    for got in (run_fused(kind, x, weight, bias, 1e-5, False, dy), run_reference(kind, x, weight, bias, 1e-5, False, dy)):
        y, dx, dw, db = got
        assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all()
        assert_close(y, want_y.float(), name="output", rtol=2e-6, atol=2e-6)
        assert_close(dx.double() * std, want_dx * std, name="grad_input * std", rtol=1e-5, atol=1e-5)
        assert_close(dw, want_dw.float(), name="grad_weight", rtol=1e-5, atol=1e-5)
        if db is not None:
            assert_close(db, want_db.float(), name="grad_bias")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_fused_norms_near_fp32_limit_share_the_safe_statistics(cpu_tier, kind):
    """add_layernorm / add_rmsnorm (statistics of s = x + 0) and the norm -> FP8 forms."""
    x = near_fp32_limit()
    weight = torch.rand(x.shape[-1]) + 0.5
    bias = torch.randn(x.shape[-1]) if kind == "layernorm" else None
    want_y = run_torch(kind, x, weight, bias, 1e-5, False, torch.ones_like(x), torch.float64)[0].float()
    args = (weight, bias) if kind == "layernorm" else (weight,)
    y, s = getattr(te.kernels, f"add_{kind}")(x, torch.zeros_like(x), *args)
    assert torch.equal(s, x)
    assert_close(y, want_y, name="add_norm output", rtol=2e-6, atol=2e-6)
    scale = torch.tensor([100.0])
    data, amax, *_, y8 = getattr(te.kernels, f"{kind}_fp8")(x, *args, scale, torch.float8_e4m3fn, return_output=True)
    assert_close(y8, want_y, name="norm_fp8 output", rtol=2e-6, atol=2e-6)
    want_data, want_amax = reference.fp8_quantize(y8, scale, torch.float8_e4m3fn)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))
    assert amax.item() == want_amax.item() and torch.isfinite(amax)


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("norm")


def _stats(x, w, b):
    with torch.no_grad():
        _, mean, rstd = ops.layernorm_fwd(x, w, b, 1e-5, False)
        _, rms_rstd = ops.rmsnorm_fwd(x, w, 1e-5, False)
    return mean, rstd, rms_rstd


@CASES.case("layernorm_fwd")
def _(d):
    x, w, b, _ = basic_inputs(d)
    return (x, w, b, 1e-5, False), ()


@CASES.case("layernorm_bwd")
def _(d):
    x, w, b, dy = basic_inputs(d)
    mean, rstd, _ = _stats(x, w, b)
    return (dy, x, mean, rstd, w, False), ()


@CASES.case("rmsnorm_fwd")
def _(d):
    x, w, _, _ = basic_inputs(d)
    return (x, w.bfloat16(), 1e-5, True), ()


@CASES.case("rmsnorm_bwd")
def _(d):
    x, w, b, dy = basic_inputs(d)
    _, _, rms_rstd = _stats(x, w, b)
    return (dy, x, rms_rstd, w, False), ()


@CASES.case("add_layernorm_fwd")
def _(d):
    x, w, b, dy = basic_inputs(d)
    return (x, dy, w, b, 1e-5, False), ()


@CASES.case("add_layernorm_bwd")
def _(d):
    x, w, b, dy = basic_inputs(d)
    mean, rstd, _ = _stats(x, w, b)
    return (dy, x, x, mean, rstd, w, False), ()


@CASES.case("add_rmsnorm_fwd")
def _(d):
    x, w, b, dy = basic_inputs(d)
    return (x, dy, w, 1e-5, False), ()


@CASES.case("add_rmsnorm_bwd")
def _(d):
    x, w, b, dy = basic_inputs(d)
    _, _, rms_rstd = _stats(x, w, b)
    return (dy, x, x, rms_rstd, w, False), ()


@CASES.case("layernorm_fp8_fwd")
def _(d):
    x, w, b, _ = basic_inputs(d)
    return (x, w, b, torch.tensor([3.0], device=d), E4M3, 1e-5, False, True), (0,)


@CASES.case("rmsnorm_fp8_fwd")
def _(d):
    x, w, _, _ = basic_inputs(d)
    return (x, w, torch.tensor([3.0], device=d), E5M2, 1e-5, False, False), (0,)


# Norms: x, weight and bias of one dtype, [4, 3, 40]; the forwards with grad. torch.compile runs
# on the fp32 forwards (forward and backward).


def _norm_inputs(d, dtype, grad):
    x = randn(d, 4, 3, 40, dtype=dtype, scale=2.0, shift=0.5, grad=grad)
    w = randn(d, 40, dtype=dtype, scale=0.3, shift=1.0, grad=grad)
    b = randn(d, 40, dtype=dtype, grad=grad)
    return x, w, b, randn(d, 4, 3, 40, dtype=dtype), randn(d, 4, 3, 40, dtype=dtype)


for _dtype in (F32, BF16):
    _t, _fp32 = dtype_name(_dtype), _dtype == F32

    @CASES.case(f"layernorm_fwd[{_t}, bias]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, b, _, _ = _norm_inputs(d, dtype, grad=True)
        return (x, w, b, 1e-5, False), ()

    @CASES.case(f"layernorm_fwd[{_t}, no bias, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, _, _, _ = _norm_inputs(d, dtype, grad=True)
        return (x, w, None, 1e-5, True), ()

    @CASES.case(f"rmsnorm_fwd[{_t}]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, _, _, _ = _norm_inputs(d, dtype, grad=True)
        return (x, w, 1e-5, False), ()

    @CASES.case(f"layernorm_bwd[{_t}]", compile=False)
    def _(d, dtype=_dtype):
        x, w, b, dy, _ = _norm_inputs(d, dtype, grad=False)
        mean, rstd, _ = _stats(x, w, b)
        return (dy, x, mean, rstd, w, False), ()

    @CASES.case(f"rmsnorm_bwd[{_t}, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, b, dy, _ = _norm_inputs(d, dtype, grad=False)
        _, _, rms_rstd = _stats(x, w, b)
        return (dy, x, rms_rstd, w, True), ()

    # The residual-add fusions: x and the residual with grad.
    @CASES.case(f"add_layernorm_fwd[{_t}, bias]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, b, residual, _ = _norm_inputs(d, dtype, grad=True)
        return (x, residual.requires_grad_(), w, b, 1e-5, False), ()

    @CASES.case(f"add_layernorm_fwd[{_t}, no bias, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, _, residual, _ = _norm_inputs(d, dtype, grad=True)
        return (x, residual.requires_grad_(), w, None, 1e-5, True), ()

    @CASES.case(f"add_rmsnorm_fwd[{_t}]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, _, residual, _ = _norm_inputs(d, dtype, grad=True)
        return (x, residual.requires_grad_(), w, 1e-5, False), ()

    @CASES.case(f"add_layernorm_bwd[{_t}]", compile=False)
    def _(d, dtype=_dtype):
        x, w, b, residual, dy = _norm_inputs(d, dtype, grad=False)
        with torch.no_grad():
            _, s, mean, rstd = ops.add_layernorm_fwd(x, residual, w, b, 1e-5, False)
        return (dy, randn(d, 4, 3, 40, dtype=dtype), s, mean, rstd, w, False), ()

    @CASES.case(f"add_rmsnorm_bwd[{_t}, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, _, residual, dy = _norm_inputs(d, dtype, grad=False)
        with torch.no_grad():
            _, s, rms_rstd = ops.add_rmsnorm_fwd(x, residual, w, 1e-5, False)
        return (dy, randn(d, 4, 3, 40, dtype=dtype), s, rms_rstd, w, True), ()

    # Norm -> FP8, with and without the high-precision output.
    for _output in (False, True):
        _o = ", output" if _output else ""

        @CASES.case(f"layernorm_fp8_fwd[{_t}{_o}]", compile=_fp32)
        def _(d, dtype=_dtype, output=_output):
            x, w, b, _, _ = _norm_inputs(d, dtype, grad=False)
            return (x, w, b, torch.tensor([3.0], device=d), E4M3, 1e-5, False, output), (0,)

        @CASES.case(f"rmsnorm_fp8_fwd[{_t}, e5m2, zero-centred{_o}]", compile=_fp32)
        def _(d, dtype=_dtype, output=_output):
            x, w, _, _, _ = _norm_inputs(d, dtype, grad=False)
            return (x, w, torch.tensor([3.0], device=d), E5M2, 1e-5, True, output), (0,)


@CASES.case("rmsnorm_fp8_fwd[fp32, e4m3]")
def _(d):
    x, w, _, _, _ = _norm_inputs(d, F32, grad=False)
    return (x, w, torch.tensor([2.0], device=d), E4M3, 1e-5, False, False), (0,)


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
