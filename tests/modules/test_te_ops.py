"""te.ops, TE's fusible operations: every fusion Sequential makes equals running its ops one by
one (bit for bit: the fused producers write the codes the separate casts would), in high
precision and under each FP8 recipe, forward and every gradient; the extra-input / extra-output
plumbing, op_kwargs buffers, Quantize, L2Normalization and the refusals."""
import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.ops import fused

H = 64
RECIPES = [None, recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling(),
           recipe.Float8BlockScaling()]


def run(model, x, extras=(), fp8_recipe=None, one_by_one=False):
    """(output(s), input gradient, parameter gradients) of model on a copy of x; one_by_one
    calls each op itself instead of the Sequential."""
    x = x.detach().clone().requires_grad_()
    extras = [e.detach().clone().requires_grad_() for e in extras]
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        if one_by_one:
            out, pending, extra_outputs = x, list(extras), []
            for op in model:
                taken, pending = pending[:op.num_extra_inputs], pending[op.num_extra_inputs:]
                out = op(out, *taken)
                if op.num_extra_outputs:
                    out, *more = out
                    extra_outputs += more
            out = (out, *extra_outputs) if extra_outputs else out
        else:
            out = model(x, *extras)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return outs, [x.grad] + [e.grad for e in extras], [p.grad for p in model.parameters()]


def assert_same(a, b, tol=0.0):
    for left, right in zip(a, b):
        for u, v in zip(left, right):
            if u is None or v is None:
                assert u is None and v is None
            else:
                torch.testing.assert_close(u, v, rtol=tol, atol=tol)


# A Bias op folded into the GEMM's epilogue is added to the fp32 sums before their one rounding,
# one rounding fewer than adding it after the GEMM: equal within an fp32 ulp or two.
EPILOGUE = 1e-5


@pytest.mark.parametrize("fp8_recipe", RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("build, fusions, tol", [
    (lambda: [te.ops.LayerNorm(H), te.ops.Linear(H, 32)], [fused.ForwardNormLinear], 0.0),
    (lambda: [te.ops.Quantize(), te.ops.Linear(H, 32)], [te.ops.Quantize, fused.ForwardLinearBiasActivation], 0.0),
    (lambda: [te.ops.BasicLinear(H, 32), te.ops.ConstantScale(2.0)], [fused.BackwardLinearScale], 0.0),
    (lambda: [te.ops.RMSNorm(H), te.ops.BasicLinear(H, 32), te.ops.Bias(32)], [fused.ForwardNormLinear], EPILOGUE),
    (lambda: [te.ops.BasicLinear(H, 64), te.ops.Bias(64), te.ops.GELU()], [fused.ForwardLinearBiasActivation],
     EPILOGUE),
    (lambda: [te.ops.Identity(), te.ops.Bias(H), te.ops.SwiGLU()], [te.ops.Identity, fused.BackwardActivationBias],
     0.0),
    (lambda: [te.ops.GELU(), te.ops.Linear(H, 32)], [fused.ForwardActivationLinear], 0.0),
    (lambda: [te.ops.BasicLinear(H, H), te.ops.Bias(H), te.ops.AddExtraInput()], [fused.ForwardLinearBiasAdd],
     EPILOGUE),
    (lambda: [te.ops.BasicLinear(H, H), te.ops.ConstantScale(0.5), te.ops.AddExtraInput()],
     [fused.ForwardLinearScaleAdd], 0.0),
    (lambda: [te.ops.MakeExtraOutput(), te.ops.BasicLinear(H, H)], [fused.BackwardLinearAdd], 0.0),
    # The extra output's gradient is added in fp32 inside the norm's backward kernel.
    (lambda: [te.ops.MakeExtraOutput(), te.ops.RMSNorm(H)], [fused.BackwardAddRMSNorm], EPILOGUE),
])
def test_each_fusion_equals_its_ops_one_by_one(build, fusions, tol, fp8_recipe):
    torch.manual_seed(0)
    model = te.ops.Sequential(*build())
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # biases and norm weights away from their 0 / 1 starts
    reference = copy.deepcopy(model)
    assert [type(u) for u, _ in model._groups(frozenset())[0]._forward_ops] == fusions
    x = torch.randn(16, H)
    extras = [torch.randn(16, H)] if any(isinstance(op, te.ops.AddExtraInput) for op in model) else []
    assert_same(run(model, x, extras, fp8_recipe), run(reference, x, extras, fp8_recipe, one_by_one=True), tol)


def test_delayed_scaling_state_matches_after_several_fused_steps():
    """The norm -> FP8 and activation -> FP8 producers record the amaxes the casts would."""
    torch.manual_seed(1)
    ops = [te.ops.RMSNorm(H), te.ops.Linear(H, 128), te.ops.SReLU(), te.ops.Linear(128, H)]
    model, reference = te.ops.Sequential(*ops), te.ops.Sequential(*copy.deepcopy(ops))
    rec = recipe.DelayedScaling(amax_history_len=3)
    for _ in range(3):
        x = torch.randn(8, H)
        assert_same(run(model, x, (), rec), run(reference, x, (), rec, one_by_one=True))
    for fused_linear, plain_linear in ((model[1], reference[1]), (model[3], reference[3])):
        for key in ("scaling_fwd", "scaling_bwd"):
            torch.testing.assert_close(fused_linear.fp8_meta[key].amax_history, plain_linear.fp8_meta[key].amax_history)
            torch.testing.assert_close(fused_linear.fp8_meta[key].scale, plain_linear.fp8_meta[key].scale)


def test_extra_inputs_and_outputs_are_handed_out_in_order():
    model = te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.ConstantScale(2.0), te.ops.AddExtraInput(),
                              te.ops.MakeExtraOutput(), te.ops.AddExtraInput())
    x, a, b = torch.ones(2, 3), torch.full((2, 3), 10.0), torch.full((2, 3), 100.0)
    y, first, second = model(x, a, b)
    torch.testing.assert_close(first, x)
    torch.testing.assert_close(second, 2 * x + a)
    torch.testing.assert_close(y, 2 * x + a + b)
    with pytest.raises(ValueError, match="extra input"):
        model(x, a)
    with pytest.raises(ValueError, match="were not used"):
        te.ops.Sequential(te.ops.Identity())(x, a)


def test_operation_fuser_runs_its_ops_as_sequential_does():
    """TE's ops.fuser.OperationFuser over basic ops, a fused op's and a Sequential's: the same
    outputs as te.ops.Sequential, its extra inputs counted, per-op keywords in basic-op order."""
    from transformer_engine.pytorch.ops.fuser import OperationFuser
    torch.manual_seed(0)
    linear, bias = te.ops.Linear(8, 8, bias=False), te.ops.Bias(8)
    inner = te.ops.Sequential(te.ops.GELU(), te.ops.AddExtraInput())
    fuser = OperationFuser([linear, bias, inner])
    x, residual = torch.randn(4, 8), torch.randn(4, 8)
    assert fuser.num_extra_inputs == 1
    torch.testing.assert_close(fuser(x, residual), te.ops.Sequential(linear, bias, inner)(x, residual))
    torch.testing.assert_close(fuser(x, residual, basic_op_kwargs=[{}, {}, {}, {}]), fuser(x, residual))
    with pytest.raises(ValueError, match="expected 1 extra inputs but got 0"):
        fuser(x)
    with pytest.raises(ValueError, match="basic_op_kwargs has 2 entries for 4"):
        fuser(x, residual, basic_op_kwargs=[{}, {}])
    with pytest.raises(TypeError, match="te.ops operations, got Linear"):
        OperationFuser([torch.nn.Linear(8, 8)])


def test_grouped_linear_op_writes_into_the_given_buffers():
    from transformer_engine.pytorch.ops.basic.grouped_linear import GRAD_INPUT_BUFFER_KEY, OUTPUT_BUFFER_KEY
    torch.manual_seed(2)
    op = te.ops.GroupedLinear(2, 16, 8)
    model = te.ops.Sequential(op)
    x = torch.randn(10, 16, requires_grad=True)
    out_buf, grad_buf = torch.zeros(10, 8), torch.zeros(10, 16)
    y = model(x, [4, 6], op_kwargs={op: {OUTPUT_BUFFER_KEY: out_buf, GRAD_INPUT_BUFFER_KEY: grad_buf}})
    assert y.data_ptr() == out_buf.data_ptr()
    torch.testing.assert_close(y, te.GroupedLinear.forward(op, x.detach(), [4, 6]))
    y.sum().backward()
    torch.testing.assert_close(grad_buf, x.grad)
    with pytest.raises(ValueError, match="output buffer"):
        model(x, [4, 6], op_kwargs={op: {OUTPUT_BUFFER_KEY: torch.zeros(11, 8)}})


@pytest.mark.parametrize("fp8_recipe", RECIPES[1:], ids=lambda r: type(r).__name__)
def test_quantize_casts_forward_and_backward(fp8_recipe):
    torch.manual_seed(3)
    x = torch.randn(32, 64, requires_grad=True)
    op = te.ops.Quantize(forward=True, backward=True)
    with te.autocast(recipe=fp8_recipe):
        y = op(x)
    assert isinstance(y, te.QuantizedTensor)
    torch.testing.assert_close(y.dequantize(), x, rtol=0.13, atol=0.02)
    dy = torch.randn(32, 64)
    y.backward(dy)
    assert isinstance(x.grad, te.QuantizedTensor)  # cast to the backward format
    torch.testing.assert_close(x.grad.dequantize(), dy, rtol=0.26, atol=0.05)
    assert not torch.equal(x.grad.dequantize(), dy)
    assert te.ops.Quantize()(x) is x  # outside te.autocast: the identity


def test_l2_normalization_and_qk_norm_use_the_op():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    y = te.ops.L2Normalization(eps=0.0)(x)
    expected = x.double() / x.double().norm(dim=-1, keepdim=True)
    torch.testing.assert_close(y.double(), expected, rtol=1e-2, atol=1e-3)
    mha = te.MultiheadAttention(64, 4, qk_norm_type="L2Normalization")
    assert isinstance(mha.q_norm, te.ops.L2Normalization)


def test_communication_ops_are_the_identity_on_one_rank():
    x = torch.randn(4, 3)
    for op in (te.ops.AllReduce(), te.ops.AllGather(), te.ops.ReduceScatter()):
        assert op(x) is x


@pytest.mark.parametrize("call, error, words", [
    (lambda: te.ops.Sequential(3), TypeError, "nn.Module"),
    (lambda: te.ops.Bias(0), ValueError, "size"),
    (lambda: te.ops.Bias(4)(torch.randn(2, 5)), ValueError, "size=4"),
    (lambda: te.ops.GELU(glu_interleave_size=32), ValueError, "glu_interleave_size"),
    (lambda: te.ops.SwiGLU(glu_interleave_size=3)(torch.ones(2, 8)), ValueError, "multiple of 2"),
    (lambda: te.ops.AddExtraInput()(torch.ones(2), torch.ones(3)), ValueError, "extra input"),
    (lambda: te.ops.Dropout(1.5), ValueError, "p must"),
])
def test_bad_arguments_are_refused(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("op, plain", [
    (te.ops.ScaledSwiGLU(), lambda x: torch.nn.functional.silu(x[..., :8]) * x[..., 8:]),
    (te.ops.ScaledSReLU(), lambda x: torch.relu(x).square()),
])
def test_scaled_activations_multiply_each_row_by_its_scale(op, plain):
    torch.manual_seed(4)
    x = torch.randn(5, 3, 16, requires_grad=True)
    scales = torch.rand(5, 3, requires_grad=True)
    x64, scales64 = (t.detach().double().requires_grad_() for t in (x, scales))
    y, expected = op(x, scales), plain(x64) * scales64.unsqueeze(-1)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(y)
    y.backward(dy)
    expected.backward(dy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scales.grad.double(), scales64.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="scales has shape"):
        op(x, scales[:, :2])


@pytest.mark.parametrize("offset", [1.0, 0.0, 0.5])
@pytest.mark.parametrize("interleave", [None, 4])
def test_clamped_swiglu_offsets_and_interleaved_halves(offset, interleave):
    torch.manual_seed(5)
    x = (torch.randn(6, 32) * 2).requires_grad_()
    op = te.ops.ClampedSwiGLU(limit=0.75, alpha=1.702, glu_linear_offset=offset, glu_interleave_size=interleave)
    x64 = x.detach().double().requires_grad_()
    halves = x64 if interleave is None else x64.reshape(6, 32 // 8, 2, 4).transpose(-3, -2).reshape(6, 32)
    gate, linear = halves.chunk(2, dim=-1)
    gate = gate.clamp(max=0.75)
    expected = gate * torch.sigmoid(1.702 * gate) * (linear.clamp(-0.75, 0.75) + offset)
    y = op(x)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(y)
    y.backward(dy)
    expected.backward(dy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_linear_op_computes_in_its_own_dtype():
    op = te.ops.Linear(16, 8, dtype=torch.bfloat16)
    x = torch.randn(4, 16, requires_grad=True)
    y = op(x)
    y.sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.float32 and op.weight.grad.dtype == torch.bfloat16


def test_add_extra_input_in_place_writes_into_the_extra_input():
    x = torch.ones(3, requires_grad=True)
    extra = torch.full((3,), 2.0, requires_grad=True)
    y = te.ops.AddExtraInput(in_place=True)(x, extra)
    assert y.data_ptr() == extra.data_ptr() and torch.equal(extra.detach(), torch.full((3,), 3.0))
    (y * torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(3.0))
    torch.testing.assert_close(extra.grad, torch.arange(3.0))


def test_sequential_is_a_list_of_modules():
    ops = [te.ops.Identity(), torch.nn.Identity(), te.ops.ConstantScale(2.0)]
    model = te.ops.Sequential(*ops)
    assert list(model) == ops and model[-1] is ops[2] and list(model[1:]) == ops[1:]
    replacement = te.ops.ConstantScale(3.0)
    model[2] = replacement
    torch.testing.assert_close(model(torch.ones(2)), torch.full((2,), 3.0))
    model.insert(0, te.ops.ConstantScale(0.5))
    assert model.pop(0).scale == 0.5
    del model[0]
    assert list(model) == [ops[1], replacement]
    both = model + te.ops.Sequential(te.ops.ConstantScale(2.0))
    torch.testing.assert_close(both(torch.ones(2)), torch.full((2,), 6.0))
    assert [type(group).__name__ for group in both._module_groups] == ["Identity", "OperationGroup"]


def test_grouped_linear_op_scales_each_tokens_bias():
    torch.manual_seed(6)
    op = te.ops.GroupedLinear(2, 8, 4, scale_bias=True)
    with torch.no_grad():
        op.bias0.normal_()
        op.bias1.normal_()
    x, scales = torch.randn(5, 8), torch.rand(5)
    y = op(x, [2, 3], scales)
    weights, biases = (op.weight0, op.weight1), (op.bias0, op.bias1)
    expected = torch.cat([x[:2] @ weights[0].t() + biases[0] * scales[:2, None],
                          x[2:] @ weights[1].t() + biases[1] * scales[2:, None]])
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="scales of shape"):
        op(x, [2, 3], scales[:4])


def test_linear_op_quantizer_interface():
    op = te.ops.BasicLinear(32, 16)
    with te.autocast(recipe=recipe.DelayedScaling()):
        op(torch.randn(4, 32))
    assert isinstance(op.get_quantizer("forward", 1), te.Float8Quantizer)
    assert op._fp8_metas["forward"]["scaling_fwd"] is op.fp8_meta["scaling_fwd"]
    with pytest.raises(ValueError, match="mode"):
        op.get_quantizer("sideways", 0)
