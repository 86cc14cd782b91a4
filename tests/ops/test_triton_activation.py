"""The Triton activation kernels (transformer_engine/pytorch/triton/activation.py) against the
reference ops: on CUDA tensors where a GPU is present, else on CPU tensors in Triton's
interpreter (conftest.py). Every activation's output, input and bias gradients and FP8 codes
and amax, in fp32, bf16 and fp16; rows spanning several column blocks, bias gradients over
several row groups, flat (plain, bias-free) inputs, odd sizes, zero rows; infinities, NaN and
huge values; that the ops dispatch to the kernels; and that they compile for sm_90 and sm_100
with no float64 arithmetic and saturating FP8 conversions (tests/helpers/triton_harness.py)."""
import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from numerics import assert_close, assert_same_fp8
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.reference import activation as reference
from transformer_engine.pytorch.reference.fp8_cast import fp8_quantize

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import activation as kernels  # noqa: E402

KINDS = list(reference.PLAIN + reference.GATED)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LIMIT, ALPHA = 7.0, 1.702
# (shape, with_bias): odd sizes; a row over several column blocks (forward 4096 wide, bias
# gradient 1024 wide); 300 rows: the bias gradient's row groups walk several tiles each; a
# flat input over several programs; zero rows.
SHAPES = [((3, 37, 70), True), ((37, 200), False), ((3, 8260), True), ((300, 64), True), ((2, 9000), False),
          ((1, 2), True), ((0, 48), True), ((2, 0, 64), False)]


def _inputs(kind, shape, dtype, with_bias, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator) * 3).to(dtype)
    bias = torch.randn(shape[-1], generator=generator).to(dtype) if with_bias else None
    dy = torch.randn(reference.output_shape(x, kind), generator=generator).to(dtype)
    return [t.to(DEVICE) if t is not None else None for t in (x, bias, dy)]


def _assert(got, want, name, **tol):
    assert got.dtype == want.dtype, f"{name}: {got.dtype} != {want.dtype}"
    assert_close(got.cpu(), want.cpu(), name=name, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_backward_match_reference(kind, dtype):
    for shape, with_bias in SHAPES:
        x, bias, dy = _inputs(kind, shape, dtype, with_bias)
        _assert(kernels.activation_fwd(x, bias, kind, LIMIT, ALPHA), reference.activation_fwd(x, bias, kind),
                f"{kind} {shape} output")
        # 1 - s loses its relative accuracy where it is tiny, by an fp32 ulp of 1 times |x| |b| |dy|
        # in the gradients (as in test_activation_ops.py).
        grad_scale = float(dy.abs().amax()) * float(x.float().abs().amax()) ** 2 if x.numel() else 0.0
        grad_tol = {"atol": max(1e-7 * grad_scale, 1e-5)}
        _assert(kernels.activation_bwd(dy, x, bias, kind, LIMIT, ALPHA), reference.activation_bwd(dy, x, bias, kind),
                f"{kind} {shape} grad_input", **grad_tol)
        if bias is None:
            continue
        grad_input, grad_bias = kernels.activation_bwd_dbias(dy, x, bias, kind, LIMIT, ALPHA)
        want_input, want_bias = reference.activation_bwd_dbias(dy, x, bias, kind)
        _assert(grad_input, want_input, f"{kind} {shape} grad_input (dbias)", **grad_tol)
        # grad_bias sums over the rows: fp32 partials summed in another order.
        rows = max(1, x.numel() // shape[-1])
        _assert(grad_bias, want_bias, f"{kind} {shape} grad_bias", atol=grad_tol["atol"] * rows ** 0.5)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_is_the_cast_of_the_forward(kind, dtype, fp8_dtype):
    """Codes bit for bit and amax exactly those of fp8_quantize(activation_fwd(...)) (the
    kernels' own forward), saturation included; within FP8 tolerance of the reference."""
    for shape, with_bias in SHAPES[:4] + SHAPES[-2:]:
        x, bias, _ = _inputs(kind, shape, dtype, with_bias)
        scale = torch.tensor([30.0], device=DEVICE)  # saturates part of the output
        data, amax = kernels.activation_fp8(x, bias, kind, LIMIT, ALPHA, scale, fp8_dtype)
        want_data, want_amax = fp8_quantize(kernels.activation_fwd(x, bias, kind, LIMIT, ALPHA), scale, fp8_dtype)
        assert_same_fp8(data.cpu(), want_data.cpu())
        assert amax.dtype == torch.float32 and amax.shape == ()
        assert amax.item() == want_amax.item(), f"{kind} {shape} amax"
        ref_data, ref_amax = reference.activation_fp8(x, bias, kind, LIMIT, ALPHA, scale, fp8_dtype)
        assert_close(data.float().cpu(), ref_data.float().cpu(), dtype=fp8_dtype, name=f"{kind} {shape} codes")
        assert_close(amax.cpu(), ref_amax.cpu(), dtype=dtype, name=f"{kind} {shape} amax")


def _extreme_inputs(kind):
    """Every pair of special values: x (plain) or a x b (gated), in fp32."""
    values = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e4, -1e4, 100.0, -100.0, 20.0,
                           -20.0, 8.0, -8.0, 1.0, -1.0, 0.0, -0.0])
    n = len(values)
    if kind in reference.PLAIN:
        return values.repeat(n, 1).to(DEVICE)
    return torch.cat([values.repeat(n, 1), values.repeat_interleave(n).reshape(n, n)], dim=1).to(DEVICE)


@pytest.mark.parametrize("kind", KINDS)
def test_infinities_nan_and_huge_values(kind):
    """Same NaN positions and values as the reference: sigmoid saturates to exactly 0 and 1,
    gelu(x) is x far right and 0 far left, relu keeps a NaN. The one difference, which the CPU
    kernels share: clamped_swiglu's b gradient where b is NaN is dy * gate (the reference's 0)."""
    x = _extreme_inputs(kind)
    dy = torch.ones(reference.output_shape(x, kind), device=DEVICE)
    _assert(kernels.activation_fwd(x, None, kind, LIMIT, ALPHA), reference.activation_fwd(x, None, kind),
            f"{kind} output")
    got = kernels.activation_bwd(dy, x, None, kind, LIMIT, ALPHA)
    want = reference.activation_bwd(dy, x, None, kind)
    if kind == "clamped_swiglu":
        b_is_nan = torch.zeros_like(x, dtype=torch.bool)
        b_is_nan[:, x.shape[-1] // 2:] = x[:, x.shape[-1] // 2:].isnan()
        want = torch.where(b_is_nan, got, want)
    _assert(got, want, f"{kind} grad_input")
    data, amax = kernels.activation_fp8(x, None, kind, LIMIT, ALPHA, torch.ones(1, device=DEVICE),
                                        torch.float8_e4m3fn)
    want_data, want_amax = reference.activation_fp8(x, None, kind, LIMIT, ALPHA, torch.ones(1, device=DEVICE),
                                                    torch.float8_e4m3fn)
    assert_same_fp8(data.cpu(), want_data.cpu())
    assert amax.item() == want_amax.item()  # NaN skipped, inf counted


def test_non_contiguous_inputs_and_one_element_scale_views():
    base = torch.randn(70, 48, device=DEVICE)
    scale = torch.tensor([0.5, 2.0], device=DEVICE)[1:]  # a view at an offset
    for view in (base.t(), base[::2, :]):
        for kind in ("gelu", "swiglu"):
            bias = torch.randn(view.shape[-1], device=DEVICE)
            dy = torch.randn(reference.output_shape(view, kind), device=DEVICE)
            assert torch.equal(kernels.activation_fwd(view, bias, kind, LIMIT, ALPHA),
                               kernels.activation_fwd(view.contiguous(), bias, kind, LIMIT, ALPHA))
            for g, w in zip(kernels.activation_bwd_dbias(dy.t().contiguous().t(), view, bias, kind, LIMIT, ALPHA),
                            kernels.activation_bwd_dbias(dy, view.contiguous(), bias, kind, LIMIT, ALPHA)):
                assert torch.equal(g, w)
            got = kernels.activation_fp8(view, bias, kind, LIMIT, ALPHA, scale, torch.float8_e5m2)
            want = kernels.activation_fp8(view.contiguous(), bias, kind, LIMIT, ALPHA, scale.clone(), torch.float8_e5m2)
            assert_same_fp8(got[0].cpu(), want[0].cpu())
            assert torch.equal(got[1], want[1])


def test_clamped_swiglu_limit_and_alpha():
    x, bias, dy = _inputs("clamped_swiglu", (16, 96), torch.float32, True)
    for limit, alpha in ((1.5, 0.8), (0.0, 2.0)):
        _assert(kernels.activation_fwd(x, bias, "clamped_swiglu", limit, alpha),
                reference.activation_fwd(x, bias, "clamped_swiglu", limit, alpha), "output")
        for got, want, name in zip(kernels.activation_bwd_dbias(dy, x, bias, "clamped_swiglu", limit, alpha),
                                   reference.activation_bwd_dbias(dy, x, bias, "clamped_swiglu", limit, alpha),
                                   ("grad_input", "grad_bias")):
            _assert(got, want, name, atol=1e-4)


def test_the_ops_dispatch_to_the_kernels_on_accelerators():
    for name in ("activation_fwd", "activation_bwd", "activation_bwd_dbias", "activation_fp8"):
        assert _registry.op_paths(name) == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}
    x = torch.ones(2, 8)
    assert kernels.supports("activation_fwd", (x.bfloat16(), None, "gelu", LIMIT, ALPHA))
    assert kernels.supports("activation_bwd_dbias", (x.half(), x.half(), x[0].half(), "swiglu", LIMIT, ALPHA))
    assert not kernels.supports("activation_fwd", (x.double(), None, "gelu", LIMIT, ALPHA))  # the reference's


def _forward_variant(activation, dtype, bias, fp8=None):
    data = POINTER[dtype]
    fn, gated = kernels._kind(activation)
    signature = {"X": data, "BIAS": data, "Y": POINTER[fp8 or dtype], "SCALE": "*fp32" if fp8 else data,
                 "AMAX_PARTIAL": "*fp32" if fp8 else data, "n_rows": "i32", "in_cols": "i32", "out_cols": "i32",
                 "limit": "fp32", "alpha": "fp32", "FN": "constexpr", "GATED": "constexpr", "HAS_BIAS": "constexpr",
                 "TO_FP8": "constexpr", "ROWS": "constexpr", "BLOCK_COLS": "constexpr"}
    constexprs = {"FN": fn, "GATED": gated, "HAS_BIAS": bias, "TO_FP8": fp8 is not None, "ROWS": 4,
                  "BLOCK_COLS": 1024}
    name = f"activation_{'fp8' if fp8 else 'fwd'}[{activation},{dtype}{f',{fp8}' if fp8 else ''},bias={bias}]"
    return name, kernels._activation_fwd_kernel, signature, constexprs


def _backward_variant(activation, dtype, bias, dbias):
    data = POINTER[dtype]
    fn, gated = kernels._kind(activation)
    signature = {"DY": data, "X": data, "BIAS": data, "DX": data, "DBIAS_PARTIAL": "*fp32" if dbias else data,
                 "n_rows": "i32", "in_cols": "i32", "out_cols": "i32", "limit": "fp32", "alpha": "fp32",
                 "tiles_per_program": "i32", "FN": "constexpr", "GATED": "constexpr", "HAS_BIAS": "constexpr",
                 "WITH_DBIAS": "constexpr", "ROWS": "constexpr", "BLOCK_COLS": "constexpr"}
    constexprs = {"FN": fn, "GATED": gated, "HAS_BIAS": bias, "WITH_DBIAS": dbias, "ROWS": 4, "BLOCK_COLS": 1024}
    name = f"activation_{'bwd_dbias' if dbias else 'bwd'}[{activation},{dtype},bias={bias}]"
    return name, kernels._activation_bwd_kernel, signature, constexprs


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/activation.py: the forward of every activation in
    bf16 (half of them with a bias), the backward with and without the bias gradient, and the FP8 forward to e4m3
    and e5m2."""
    found = [_forward_variant(activation, "bf16", bias=i % 2 == 1) for i, activation in enumerate(reference.PLAIN + reference.GATED)]
    found += [_backward_variant("swiglu", "bf16", bias=False, dbias=False), _backward_variant("gelu", "bf16", bias=True, dbias=True),
              _backward_variant("clamped_swiglu", "fp32", bias=True, dbias=True)]
    found += [_forward_variant("geglu", "bf16", bias=True, fp8="e4m3"), _forward_variant("gelu", "fp16", bias=False, fp8="e5m2")]
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every variant compile_variants names: the
    forward of all 12 activations, 3 backward ones and 2 FP8 ones (e4m3 and e5m2)."""
    assert_compiles(compile_variants, count=17, fp8_variants=2)
