"""Attention-softmax ops (TE's ScaledSoftmax family): forward and gradient against the
reference (autograd through it) on every CPU SIMD tier and on every backend (tests/helpers/backends.py:
the Triton kernels too), odd shapes, empty inputs, long rows, non-contiguous and broadcast
inputs; TE's masking rules; plus gradcheck and argument errors (opcheck and torch.compile of the ops: the op cases at the end)."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from backends import assert_refused
from numerics import assert_close, assert_two_reference
from op_cases import F32, OpCases, randn

ops = torch.ops.portable_te
SCALE = 0.37
# (public function, mask_type); the padding variant takes a mask.
VARIANTS = {
    "plain": (lambda x, mask, scale: te.kernels.scaled_softmax(x, scale), "none"),
    "masked": (lambda x, mask, scale: te.kernels.scaled_masked_softmax(x, mask, scale), "padding"),
    "causal": (lambda x, mask, scale: te.kernels.scaled_upper_triang_masked_softmax(x, scale), "causal"),
    "aligned_causal": (lambda x, mask, scale: te.kernels.scaled_aligned_causal_masked_softmax(x, scale),
                       "causal_bottom_right"),
}
# [b, h, sq, sk]
SHAPES = [(2, 3, 37, 69), (1, 2, 5, 8), (1, 2, 9, 3), (2, 1, 16, 16), (0, 2, 4, 4), (1, 1, 3, 20000)]


def shape_for(variant, shape):
    """The upper-triangular mask needs square scores: sk becomes sq."""
    b, h, sq, sk = shape
    return (b, h, sq, sq) if variant == "causal" else shape


def make_inputs(variant, shape, dtype, device="cpu"):
    x = (torch.randn(shape) * 3).to(device=device, dtype=dtype)
    dy = torch.randn(shape).to(device=device, dtype=dtype)
    mask = None
    if VARIANTS[variant][1] == "padding":
        b, _, sq, sk = shape
        mask = torch.rand(b, 1, sq, sk) < 0.3
        if sq > 1:
            mask[:, :, 1] = True  # a fully masked row
        mask = mask.to(device)
    return x, mask, dy


def run_fused(variant, x, mask, dy, scale=SCALE):
    x = x.detach().requires_grad_()
    y = VARIANTS[variant][0](x, mask, scale)
    y.backward(dy)
    return y, x.grad


def run_reference(variant, x, mask, dy, dtype, scale=SCALE):
    """The reference in `dtype` (inputs cast first) with autograd for the gradient."""
    x = x.detach().to(dtype).requires_grad_()
    y = reference.scaled_softmax_fwd(x, mask, scale, VARIANTS[variant][1])
    y.backward(dy.to(dtype))
    return y, x.grad


def run_plain_low_precision(variant, x, mask, dy, scale=SCALE):
    """What plain PyTorch computes with every step in x's dtype: the two-reference baseline."""
    x = x.detach().requires_grad_()
    z = x * scale
    mask_type = VARIANTS[variant][1]
    if mask_type == "padding":
        z = z.masked_fill(mask, -10000.0)
    elif mask_type != "none":
        sq, sk = x.shape[-2:]
        offset = sk - sq if mask_type == "causal_bottom_right" else 0
        z = z.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(offset + 1), float("-inf"))
    y = torch.softmax(z, dim=-1).nan_to_num(0.0)
    y.backward(dy)
    return y, x.grad


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_float32_matches_reference_on_every_tier(cpu_tier, variant, shape):
    shape = shape_for(variant, shape)
    x, mask, dy = make_inputs(variant, shape, torch.float32)
    y, dx = run_fused(variant, x, mask, dy)
    y_ref, dx_ref = run_reference(variant, x, mask, dy, torch.float32)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert_close(y, y_ref, name=f"{variant} output")
    assert_close(dx, dx_ref, name=f"{variant} grad_input")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_float32_matches_reference_on_every_backend(backend, variant, shape):
    shape = shape_for(variant, shape)
    x, mask, dy = make_inputs(variant, shape, torch.float32, backend.device)
    y, dx = run_fused(variant, x, mask, dy)
    y_ref, dx_ref = run_reference(variant, x, mask, dy, torch.float32)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert_close(y, y_ref, name=f"{variant} output")
    assert_close(dx, dx_ref, name=f"{variant} grad_input")


LOW_PRECISION_SHAPES = [(2, 3, 37, 69), (1, 2, 64, 64)]


def check_low_precision_two_reference_rule(variant, dtype, shape, device):
    shape = shape_for(variant, shape)
    x, mask, dy = make_inputs(variant, shape, dtype, device)
    y, dx = run_fused(variant, x, mask, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    y_exact, dx_exact = run_reference(variant, x, mask, dy, torch.float64)
    y_plain, dx_plain = run_plain_low_precision(variant, x, mask, dy)
    assert_two_reference(y, y_plain, y_exact, 2, name=f"{variant} {dtype} output")
    assert_two_reference(dx, dx_plain, dx_exact, 3, name=f"{variant} {dtype} grad_input")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", LOW_PRECISION_SHAPES, ids=str)
def test_low_precision_two_reference_rule(cpu_tier, variant, dtype, shape):
    check_low_precision_two_reference_rule(variant, dtype, shape, "cpu")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", LOW_PRECISION_SHAPES, ids=str)
def test_low_precision_two_reference_rule_on_every_backend(backend, variant, dtype, shape):
    check_low_precision_two_reference_rule(variant, dtype, shape, backend.device)


def test_fully_masked_row_is_uniform_with_zero_gradient(backend):
    with backend.device:
        x, dy = torch.randn(2, 2, 3, 10), torch.randn(2, 2, 3, 10)
        mask = torch.zeros(2, 1, 3, 10, dtype=torch.bool)
        mask[0, :, 1] = True
        mask[1, :, 0, 4:] = True
        y, dx = run_fused("masked", x, mask, dy)
        assert torch.allclose(y[0, :, 1], torch.full((2, 10), 0.1))
        assert torch.equal(dx[0, :, 1], torch.zeros(2, 10))
        assert torch.equal(y[1, :, 0, 4:], torch.zeros(2, 6)) and torch.equal(dx[1, :, 0, 4:], torch.zeros(2, 6))
        assert torch.allclose(y.sum(-1), torch.ones(2, 2, 3))


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 9), (9, 3)])
def test_causal_masks_are_exact_zeros(backend, sq, sk):
    x = torch.randn(2, sq, sk, device=backend.device)  # the 3-D [b*h, sq, sk] layout
    y = te.kernels.scaled_aligned_causal_masked_softmax(x, 1.0).cpu()
    visible = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    assert torch.equal(y[:, ~visible], torch.zeros_like(y[:, ~visible]))
    rows_with_keys = visible.any(-1)
    assert torch.allclose(y.sum(-1)[:, rows_with_keys], torch.ones(2, int(rows_with_keys.sum())))
    if sq == sk:
        assert torch.equal(te.kernels.scaled_upper_triang_masked_softmax(x, 1.0).cpu(), y)


@pytest.mark.parametrize("variant", ["causal", "masked"])
def test_outputs_past_the_cache_use_streaming_stores_correctly(variant):
    # 16 MiB of bf16 output: rows are written with streaming stores, causal limits inside them.
    x, mask, dy = make_inputs(variant, (1, 8, 1024, 1024), torch.bfloat16)
    y, dx = run_fused(variant, x, mask, dy)
    y_ref, dx_ref = run_reference(variant, x, mask, dy, torch.float32)
    assert_close(y, y_ref.to(torch.bfloat16), name="output")
    assert_close(dx, dx_ref.to(torch.bfloat16), name="grad_input", atol=1e-3)


def test_broadcast_and_non_contiguous_inputs(backend):
    with backend.device:
        base = torch.randn(2, 7, 3, 33)
        dy = torch.randn(2, 3, 7, 33)
        masks = (torch.rand(1, 1, 7, 33) < 0.4, (torch.rand(2, 1, 1, 33) < 0.4),
                 (torch.rand(2, 1, 33, 7) < 0.4).transpose(-1, -2), torch.rand(2, 3, 7, 33) < 0.4)
    x = base.transpose(1, 2)  # [2, 3, 7, 33], non-contiguous
    for mask in masks:
        y, dx = run_fused("masked", x, mask, dy)
        y_ref, dx_ref = run_reference("masked", x, mask, dy, torch.float32)
        assert_close(y, y_ref, name="output")
        assert_close(dx, dx_ref, name="grad_input")


def test_nan_input_propagates_to_its_row(backend):
    x = torch.randn(1, 1, 2, 20)
    x[0, 0, 0, 17] = float("nan")
    y = te.kernels.scaled_softmax(x.to(backend.device), 1.0).cpu()
    assert torch.isnan(y[0, 0, 0]).all() and not torch.isnan(y[0, 0, 1]).any()


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradcheck_float64(variant):
    shape = (1, 2, 5, 5) if variant == "causal" else (1, 2, 4, 7)
    x, mask, _ = make_inputs(variant, shape, torch.float64)
    fn = VARIANTS[variant][0]
    assert torch.autograd.gradcheck(lambda a: fn(a, mask, SCALE), (x.requires_grad_(),))


def test_double_backward_raises():
    x = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    y = te.kernels.scaled_softmax(x, 1.0)
    (g,) = torch.autograd.grad(y, x, torch.randn_like(y), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        g.sum().backward()


def x4():
    return torch.randn(2, 3, 4, 5)


BAD_CALLS = [
    (lambda: te.kernels.scaled_upper_triang_masked_softmax(torch.randn(2, 4, 6), 1.0), ["sq == sk", "[2, 4, 6]"]),
    (lambda: te.kernels.scaled_softmax(torch.randn(4, 5), 1.0), ["input", "[4, 5]"]),
    (lambda: te.kernels.scaled_softmax(torch.ones(1, 2, 3, dtype=torch.int32), 1.0), ["input", "Int"]),
    (lambda: te.kernels.scaled_masked_softmax(x4(), torch.zeros(2, 1, 4, 6, dtype=torch.bool), 1.0),
     ["mask", "[2, 1, 4, 6]", "[2, 3, 4, 5]"]),
    (lambda: te.kernels.scaled_masked_softmax(x4(), torch.zeros(3, 1, 4, 5, dtype=torch.bool), 1.0),
     ["mask", "[3, 1, 4, 5]"]),
    (lambda: te.kernels.scaled_masked_softmax(x4(), torch.zeros(2, 1, 4, 5), 1.0), ["mask", "Bool", "Float"]),
    (lambda: te.kernels.scaled_masked_softmax(torch.randn(6, 4, 5), torch.zeros(2, 1, 4, 5, dtype=torch.bool), 1.0),
     ["4-D", "[6, 4, 5]"]),
    (lambda: ops.scaled_softmax_fwd(x4(), None, 1.0, "sliding"), ["mask_type", "sliding"]),
    (lambda: ops.scaled_softmax_fwd(x4(), None, 1.0, "padding"), ["padding", "mask"]),
    (lambda: ops.scaled_softmax_fwd(x4(), torch.zeros(2, 1, 4, 5, dtype=torch.bool), 1.0, "none"), ["none", "mask"]),
    (lambda: ops.scaled_softmax_bwd(torch.randn(2, 3, 4, 4), x4(), None, 1.0, "none"),
     ["grad_output", "[2, 3, 4, 4]", "[2, 3, 4, 5]"]),
    (lambda: ops.scaled_softmax_bwd(x4().double(), x4(), None, 1.0, "none"), ["grad_output", "Double", "Float"]),
    (lambda: te.kernels.scaled_masked_softmax(x4(), torch.zeros(2, 1, 4, 5, dtype=torch.bool, device="meta"), 1.0),
     ["mask", "meta"]),
]


@pytest.mark.parametrize("call,words", BAD_CALLS)
def test_bad_input_raises_value_error_naming_argument(backend, call, words):
    """On every backend (the Triton kernels and the reference check in Python,
    custom_ops/softmax.py), and in the fake kernels torch.compile traces with."""
    assert_refused(backend, call, words)


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("softmax")


@CASES.case("scaled_softmax_fwd")
def _(d):
    return (randn(d, 2, 3, 8, 8), None, 0.5, "causal"), ()


@CASES.case("scaled_softmax_bwd")
def _(d):
    scores = randn(d, 2, 3, 8, 8)
    return (randn(d, 2, 3, 8, 8), ops.scaled_softmax_fwd(scores, None, 0.5, "causal"), None, 0.5, "causal"), ()


# Softmax: fp32 [2, 3, 5, 11] (square for the upper-triangular mask) in every mask kind, the
# padding mask [b, 1, sq, sk] with a fully masked row; the forward with grad (and compiled).
SOFTMAX_MASKS = ("none", "padding", "causal", "causal_bottom_right")


def _softmax_inputs(d, mask_type):
    shape = (2, 3, 5, 5) if mask_type == "causal" else (2, 3, 5, 11)
    x = randn(d, *shape, dtype=F32, scale=3.0)
    mask = None
    if mask_type == "padding":
        mask = torch.rand(shape[0], 1, *shape[2:]) < 0.3
        mask[:, :, 1] = True
        mask = mask.to(d)
    return x, mask, randn(d, *shape, dtype=F32)


for _mask_type in SOFTMAX_MASKS:
    @CASES.case(f"scaled_softmax_fwd[fp32, {_mask_type}]")
    def _(d, mask_type=_mask_type):
        x, mask, _ = _softmax_inputs(d, mask_type)
        return (x.requires_grad_(), mask, 0.37, mask_type), ()

    @CASES.case(f"scaled_softmax_bwd[fp32, {_mask_type}]", compile=False)
    def _(d, mask_type=_mask_type):
        x, mask, dy = _softmax_inputs(d, mask_type)
        return (dy, ops.scaled_softmax_fwd(x, mask, 0.37, mask_type), mask, 0.37, mask_type), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
