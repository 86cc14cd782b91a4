"""The norm family's fusions: residual add + LayerNorm/RMSNorm (forward and backward), and
LayerNorm/RMSNorm -> FP8. Against the reference on every CPU SIMD tier, against PyTorch in fp64
(two-reference rule for bf16), bit-exact FP8 codes against fp8_quantize of our own norm output;
odd shapes, zero rows, non-contiguous views, gradcheck, argument errors (opcheck and
torch.compile of the ops: the op cases at the end of tests/ops/test_norm_ops.py)."""
import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from backends import assert_refused
from numerics import assert_close, assert_same_fp8, assert_two_reference

ops = torch.ops.portable_te
KINDS = ["layernorm", "rmsnorm"]
SHAPES = [(1, 1), (3, 37, 69), (5, 17), (2, 3, 1000), (33, 4096), (0, 64), (4, 0, 32)]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]


def make_inputs(kind, shape, dtype, weight_dtype=None, zero_centered=False, device="cpu"):
    """x, residual, weight, bias (LayerNorm only), dy, dsum."""
    weight_dtype = weight_dtype or dtype
    hidden = shape[-1]
    x = (torch.randn(shape) * 2 + 0.5).to(dtype)
    residual = torch.randn(shape).to(dtype)
    weight = (torch.randn(hidden) * 0.3 + (0.0 if zero_centered else 1.0)).to(weight_dtype)
    bias = torch.randn(hidden).to(weight_dtype) if kind == "layernorm" else None
    tensors = (x, residual, weight, bias, torch.randn(shape).to(dtype), torch.randn(shape).to(dtype))
    return tuple(t.to(device) if t is not None else None for t in tensors)


def run_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum, eps=1e-5):
    """(y, s, dx, dresidual, dweight, dbias) through te.kernels and autograd."""
    x, residual, weight = (t.detach().requires_grad_() for t in (x, residual, weight))
    bias = bias.detach().requires_grad_() if bias is not None else None
    if kind == "layernorm":
        y, s = te.kernels.add_layernorm(x, residual, weight, bias, eps, zero_centered)
    else:
        y, s = te.kernels.add_rmsnorm(x, residual, weight, eps, zero_centered)
    torch.autograd.backward([y, s], [dy, dsum])
    return y, s, x.grad, residual.grad, weight.grad, (bias.grad if bias is not None else None)


def reference_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum, eps=1e-5):
    if kind == "layernorm":
        y, s, mean, rstd = reference.add_layernorm_fwd(x, residual, weight, bias, eps, zero_centered)
        dx, dw, db = reference.add_layernorm_bwd(dy, dsum, s, mean, rstd, weight, zero_centered)
        return y, s, dx, dx, dw, db
    y, s, rstd = reference.add_rmsnorm_fwd(x, residual, weight, eps, zero_centered)
    dx, dw = reference.add_rmsnorm_bwd(dy, dsum, s, rstd, weight, zero_centered)
    return y, s, dx, dx, dw, None


NAMES = ("output", "sum", "grad_input", "grad_residual", "grad_weight", "grad_bias")


def check_add_norm(kind, shape, dtype, weight_dtype=None, zero_centered=False, device="cpu"):
    inputs = make_inputs(kind, shape, dtype, weight_dtype, zero_centered, device)
    x, residual, weight, bias, dy, dsum = inputs
    got = run_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum)
    want = reference_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum)
    assert torch.equal(got[1], want[1]), "sum must be x + residual rounded once"
    assert torch.equal(got[2], got[3]), "input and residual get the same gradient"
    for name, g, w in zip(NAMES, got, want):
        if w is None:
            assert g is None, name
            continue
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != {w.dtype}"
        extra = {"atol": 1e-4 * max(1, shape[0]) ** 0.5} if name in ("grad_weight", "grad_bias") else {}
        assert_close(g, w, name=f"add_{kind} {name}", **extra)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_norm_matches_reference_on_every_tier(cpu_tier, kind, shape, dtype):
    check_add_norm(kind, shape, dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_norm_matches_reference_on_every_backend(backend, kind, shape, dtype):
    check_add_norm(kind, shape, dtype, device=backend.device)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_norm_zero_centered_gamma_and_parameter_dtype(backend, kind, zero_centered, weight_dtype):
    check_add_norm(kind, (6, 7, 333), torch.bfloat16, weight_dtype, zero_centered, backend.device)


@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_large_rows_use_streaming_stores_correctly(kind):
    # [2048, 4096] bf16 is 16 MiB per tensor: the streaming-store threshold.
    check_add_norm(kind, (2048, 4096), torch.bfloat16)


def torch_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum, dtype, eps=1e-5):
    """PyTorch's composition (x + residual, then layer_norm / rms_norm) with autograd, in `dtype`."""
    x, residual, weight = (t.detach().to(dtype).requires_grad_() for t in (x, residual, weight))
    bias = bias.detach().to(dtype).requires_grad_() if bias is not None else None
    s = x + residual
    gamma = weight + 1 if zero_centered else weight
    y = F.layer_norm(s, s.shape[-1:], gamma, bias, eps) if kind == "layernorm" else F.rms_norm(s, s.shape[-1:], gamma, eps)
    torch.autograd.backward([y, s], [dy.to(dtype), dsum.to(dtype)])
    return y, s, x.grad, residual.grad, weight.grad, (bias.grad if bias is not None else None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_add_norm_against_pytorch_in_float64(backend, kind, dtype, zero_centered):
    """fp32 close to PyTorch in fp64; bf16 by the two-reference rule (2x forward, 3x backward)."""
    x, residual, weight, bias, dy, dsum = make_inputs(kind, (64, 515), dtype, zero_centered=zero_centered,
                                                      device=backend.device)
    ours = run_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum)
    exact = torch_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum, torch.float64)
    if dtype == torch.float32:
        for name, o, e in zip(NAMES, ours, exact):
            if e is not None:
                assert_close(o, e, name=name, rtol=1e-5, atol=1e-4)
        return
    plain = torch_add_norm(kind, x, residual, weight, bias, zero_centered, dy, dsum, dtype)
    for name, o, p, e, factor in zip(NAMES, ours, plain, exact, (2, 2, 3, 3, 3, 3)):
        if e is not None:
            assert_two_reference(o, p, e, factor, name=f"add_{kind} {dtype} {name}")


@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_non_contiguous_inputs(backend, kind):
    x = torch.randn(70, 48, device=backend.device).t()  # [48, 70], strides (1, 48)
    residual = torch.randn(96, 70, device=backend.device)[::2]  # every other row
    assert not x.is_contiguous() and not residual.is_contiguous()
    _, _, weight, bias, dy, dsum = make_inputs(kind, x.shape, torch.float32, device=backend.device)
    got = run_add_norm(kind, x, residual, weight, bias, False, dy, dsum)
    want = run_add_norm(kind, x.contiguous(), residual.contiguous(), weight, bias, False, dy, dsum)
    for name, g, w in zip(NAMES, got, want):
        if w is not None:
            assert torch.equal(g, w), name


@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_gradcheck_float64(kind):
    x, residual, weight, bias, _, _ = make_inputs(kind, (3, 5, 11), torch.float64)
    for t in (x, residual, weight):
        t.requires_grad_()
    if kind == "layernorm":
        bias.requires_grad_()
        assert torch.autograd.gradcheck(lambda a, r, w, b: te.kernels.add_layernorm(a, r, w, b, 1e-5, True),
                                        (x, residual, weight, bias))
    else:
        assert torch.autograd.gradcheck(lambda a, r, w: te.kernels.add_rmsnorm(a, r, w, 1e-5, True), (x, residual, weight))


def test_add_norm_sum_only_used_downstream():
    """Only s reaches the loss: y's gradient is zero and dx must be exactly dsum."""
    x, residual, weight, bias, _, dsum = make_inputs("rmsnorm", (4, 24), torch.float32)
    x.requires_grad_()
    _, s = te.kernels.add_rmsnorm(x, residual, weight)
    s.backward(dsum)
    assert torch.equal(x.grad, dsum)


@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_double_backward_raises(kind):
    x, residual, weight, bias, _, _ = make_inputs(kind, (4, 16), torch.float64)
    x.requires_grad_()
    y = te.kernels.add_layernorm(x, residual, weight, bias)[0] if kind == "layernorm" else te.kernels.add_rmsnorm(x, residual, weight)[0]
    (grad_x,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_x.sum().backward()


# --- norm -> FP8 ------------------------------------------------------------------------------

def norm_fp8(kind, x, weight, bias, scale, fp8_dtype, zero_centered, return_output):
    """(data, amax, mean or None, rstd, output) of te.kernels.*_fp8."""
    if kind == "layernorm":
        return te.kernels.layernorm_fp8(x, weight, bias, scale, fp8_dtype, 1e-5, zero_centered, return_output)
    data, amax, rstd, output = te.kernels.rmsnorm_fp8(x, weight, scale, fp8_dtype, 1e-5, zero_centered, return_output)
    return data, amax, None, rstd, output


def our_norm(kind, x, weight, bias, zero_centered):
    """(y, mean or None, rstd) from the plain norm ops."""
    if kind == "layernorm":
        return ops.layernorm_fwd(x, weight, bias, 1e-5, zero_centered)
    y, rstd = ops.rmsnorm_fwd(x, weight, 1e-5, zero_centered)
    return y, None, rstd


def check_norm_fp8(kind, shape, dtype, fp8_dtype, zero_centered=False, scale_value=40.0, device="cpu"):
    x, _, weight, bias, _, _ = make_inputs(kind, shape, dtype, zero_centered=zero_centered, device=device)
    scale = torch.tensor([scale_value], device=device)  # large enough that the tails saturate
    y, mean, rstd = our_norm(kind, x, weight, bias, zero_centered)
    want_data, want_amax = te.kernels.fp8_quantize(y, scale, fp8_dtype)
    for return_output in (False, True):
        data, amax, got_mean, got_rstd, output = norm_fp8(kind, x, weight, bias, scale, fp8_dtype, zero_centered,
                                                          return_output)
        assert_same_fp8(data, want_data)
        assert amax.dtype == torch.float32 and amax.shape == ()
        assert torch.equal(amax, want_amax), (amax, want_amax)
        assert torch.equal(got_rstd, rstd)
        if mean is not None:
            assert torch.equal(got_mean, mean)
        if return_output:
            assert torch.equal(output, y)
        else:
            assert output is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
def test_norm_fp8_is_bit_exact_to_quantizing_our_norm_on_every_tier(cpu_tier, kind, shape, fp8_dtype):
    check_norm_fp8(kind, shape, torch.bfloat16, fp8_dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_fp8_dtypes_and_zero_centered_gamma(cpu_tier, kind, dtype, zero_centered):
    check_norm_fp8(kind, (7, 3, 130), dtype, torch.float8_e4m3fn, zero_centered)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
def test_norm_fp8_is_bit_exact_to_quantizing_our_norm_on_every_backend(backend, kind, shape, fp8_dtype):
    check_norm_fp8(kind, shape, torch.bfloat16, fp8_dtype, device=backend.device)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_fp8_dtypes_and_zero_centered_gamma_on_every_backend(backend, kind, dtype, zero_centered):
    check_norm_fp8(kind, (7, 3, 130), dtype, torch.float8_e4m3fn, zero_centered, device=backend.device)


@pytest.mark.parametrize("kind", KINDS)
def test_norm_fp8_large_uses_streaming_stores_correctly(kind):
    # 16M FP8 codes: the streaming-store threshold for the codes.
    check_norm_fp8(kind, (4096, 4096), torch.bfloat16, torch.float8_e4m3fn, scale_value=1.0)


def test_norm_fp8_matches_the_reference(backend):
    x, _, weight, bias, _, _ = make_inputs("layernorm", (5, 77), torch.float32, device=backend.device)
    scale = torch.tensor([8.0], device=backend.device)
    got = ops.layernorm_fp8_fwd(x, weight, bias, scale, torch.float8_e5m2, 1e-5, False, True)
    want = reference.layernorm_fp8_fwd(x, weight, bias, scale, torch.float8_e5m2, 1e-5, False, True)
    assert_same_fp8(got[0], want[0])
    for name, g, w in zip(("amax", "mean", "rstd", "output"), got[1:], want[1:]):
        assert_close(g, w, name=name)


def test_norm_fp8_amax_skips_nan_rows(backend):
    x, _, weight, bias, _, _ = make_inputs("rmsnorm", (3, 40), torch.float32, device=backend.device)
    x[1, 5] = float("nan")
    scale = torch.tensor([1.0], device=backend.device)
    data, amax, _, y = te.kernels.rmsnorm_fp8(x, weight, scale, torch.float8_e4m3fn, return_output=True)
    assert amax.item() == y[[0, 2]].abs().max().item()  # the NaN row of y never enters the amax
    assert torch.isnan(data[1].float()).all() and not torch.isnan(data[0].float()).any()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_norm_fp8_nan_rows_are_bit_exact_on_every_tier(cpu_tier, kind, dtype):
    check_norm_fp8_nan_rows(kind, dtype, "cpu")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_norm_fp8_nan_rows_are_bit_exact_on_every_backend(backend, kind, dtype):
    check_norm_fp8_nan_rows(kind, dtype, backend.device)


def check_norm_fp8_nan_rows(kind, dtype, device):
    # NaN and -inf inputs make whole rows of y NaN (-inf - -inf gives x86's default NaN): the
    # codes of y rounded in registers must still be those of quantizing the stored y, NaN
    # codes where y is NaN. 131 columns: vector bodies and a scalar tail.
    x, _, weight, bias, _, _ = make_inputs(kind, (4, 131), dtype, device=device)
    x[1, 7] = float("nan")
    x[2, 100] = float("-inf")
    scale = torch.tensor([3.0], device=device)
    y, _, _ = our_norm(kind, x, weight, bias, False)
    want_data, want_amax = te.kernels.fp8_quantize(y, scale, torch.float8_e4m3fn)
    data, amax, *_ = norm_fp8(kind, x, weight, bias, scale, torch.float8_e4m3fn, False, False)
    assert_same_fp8(data, want_data)
    assert amax.item() == want_amax.item() and not torch.isnan(amax)


def test_norm_fp8_non_contiguous_input(backend):
    x = torch.randn(64, 30, device=backend.device).t()  # [30, 64]
    _, _, weight, bias, _, _ = make_inputs("layernorm", x.shape, torch.float32, device=backend.device)
    scale = torch.tensor([4.0], device=backend.device)
    got = te.kernels.layernorm_fp8(x, weight, bias, scale, torch.float8_e4m3fn, return_output=True)
    want = te.kernels.layernorm_fp8(x.contiguous(), weight, bias, scale, torch.float8_e4m3fn, return_output=True)
    assert_same_fp8(got[0], want[0])
    for g, w in zip(got[1:], want[1:]):
        assert torch.equal(g, w)


def test_meta_tensors_use_the_fake_kernels():
    x = torch.empty(4, 7, 32, device="meta", dtype=torch.bfloat16)
    w = torch.empty(32, device="meta", dtype=torch.float32)
    y, s, mean, rstd = ops.add_layernorm_fwd(x, x, w, None, 1e-5, False)
    assert y.shape == s.shape == x.shape and s.dtype == torch.bfloat16 and mean.shape == (4, 7)
    scale = torch.empty(1, device="meta")
    data, amax, rstd, output = ops.rmsnorm_fp8_fwd(x, w, scale, torch.float8_e5m2, 1e-5, False, False)
    assert data.shape == x.shape and data.dtype == torch.float8_e5m2 and amax.shape == () and output.shape == (0,)


def test_build_info_reports_the_new_ops_as_kernels():
    info = te.build_info()
    for name in ("add_layernorm_fwd", "add_layernorm_bwd", "add_rmsnorm_fwd", "add_rmsnorm_bwd", "layernorm_fp8_fwd",
                 "rmsnorm_fp8_fwd"):
        assert info["ops"][name]["cpu"] == "kernel"


# --- bad input: a ValueError naming the argument and the sizes -------------------------------

def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _scale():
    return torch.tensor([1.0])


@pytest.mark.parametrize("call, words", [
    (lambda: ops.add_layernorm_fwd(_x(4, 8), _x(4, 9), _x(8), None, 1e-5, False), ["residual", "[4, 9]", "[4, 8]"]),
    (lambda: ops.add_rmsnorm_fwd(_x(4, 8), _x(3, 4, 8), _x(8), 1e-5, False), ["residual", "[3, 4, 8]", "[4, 8]"]),
    (lambda: ops.add_rmsnorm_fwd(_x(4, 8), _x(4, 8, dtype=torch.bfloat16), _x(8), 1e-5, False),
     ["residual", "BFloat16", "Float"]),
    (lambda: ops.add_rmsnorm_fwd(_x(4, 8), torch.ones(4, 8, device="meta"), _x(8), 1e-5, False),
     ["residual", "meta", "cpu"]),
    (lambda: ops.add_layernorm_fwd(_x(4, 8), _x(4, 8), _x(7), None, 1e-5, False), ["weight", "[7]", "[8]"]),
    (lambda: ops.add_rmsnorm_fwd(_x(4, 8), _x(4, 8), _x(8), -1.0, False), ["eps", "-1"]),
    (lambda: ops.add_rmsnorm_bwd(_x(3, 5), _x(3, 6), _x(3, 5), _x(3), _x(5), False), ["grad_sum", "[3, 6]", "[3, 5]"]),
    (lambda: ops.add_layernorm_bwd(_x(3, 5), _x(3, 5), _x(3, 5), _x(4), _x(3), _x(5), False), ["mean", "[4]", "[3]"]),
    (lambda: ops.layernorm_fp8_fwd(_x(4, 8), _x(8), None, _x(2), torch.float8_e4m3fn, 1e-5, False, False),
     ["scale", "[2]"]),
    (lambda: ops.rmsnorm_fp8_fwd(_x(4, 8), _x(8), _scale().double(), torch.float8_e4m3fn, 1e-5, False, False),
     ["scale", "Double"]),
    (lambda: ops.rmsnorm_fp8_fwd(_x(4, 8), _x(8), _scale(), torch.bfloat16, 1e-5, False, False), ["fp8_dtype", "BFloat16"]),
    (lambda: ops.rmsnorm_fp8_fwd(_x(4, 8, dtype=torch.float64), _x(8, dtype=torch.float64), _scale(),
                                 torch.float8_e4m3fn, 1e-5, False, False), ["input", "Double"]),
    (lambda: ops.layernorm_fp8_fwd(_x(4, 8), _x(9), None, _scale(), torch.float8_e4m3fn, 1e-5, False, False),
     ["weight", "[9]", "[8]"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error_naming_argument(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python, custom_ops/norm.py),
    and in the fake kernels torch.compile traces with."""
    assert_refused(backend, call, words)


def test_fused_bench_cases_providers_agree():
    """The benchmark's providers compute the same thing (tiny shapes; compile included)."""
    from transformer_engine.bench import norm_cases
    torch._dynamo.reset()
    cpu = torch.device("cpu")
    for op in KINDS:
        for mode in ("fwd", "bwd"):
            case = norm_cases.add_norm_case(op, (16, 64), torch.float32, mode, cpu)
            assert case.bytes == 4 * 16 * 64 * 4
            results = {name: run() for name, run in case.providers.items()}
            for name in ("eager", "compile"):
                for got, want in zip(results["ours"], results[name]):
                    assert_close(got, want, name=f"add_{op} {mode} {name}", atol=1e-4)
        case = norm_cases.norm_fp8_case(op, (16, 64), torch.float32, cpu)
        results = {name: run() for name, run in case.providers.items()}
        for name in ("eager", "compile"):
            assert_same_fp8(results["ours"][0], results[name][0])
            assert_close(results["ours"][1], results[name][1], name=f"{op}_fp8 amax {name}")
