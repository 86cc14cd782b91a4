"""fp8_mha: FP8 tensors handed between MultiheadAttention's GEMMs and its attention without a
high-precision round trip (TE 2.18's rules). Each hand-off is checked against the path that
casts the values again with the same scale, bit for bit, and by the slot that no longer casts
(its amax stays unrecorded): te.Linear reads an FP8 input and an FP8 output gradient as their
codes; DotProductAttention reads FP8 q, k, v as their codes (each with its own scale), returns
O as the O slot's FP8 tensor with fp8_output, reads an FP8 gradient of O as its codes, and
returns FP8 gradients to FP8 inputs; the views between them (split, view, permute, squeeze)
and the concatenation of the gradients keep the codes."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.attention import fp8_attention as slots
from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer, Float8Tensor

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16 = torch.bfloat16
ops = torch.ops.portable_te
DS = recipe.DelayedScaling(fp8_dpa=True, amax_history_len=1, amax_compute_algo="most_recent")
MHA_DS = recipe.DelayedScaling(fp8_dpa=True, fp8_mha=True)


def fp8(x, scale, fp8_dtype=E4M3, requires_grad=False):
    """x as a Float8Tensor cast with `scale` (differentiable when requires_grad)."""
    quantizer = Float8Quantizer(torch.tensor([scale]), torch.zeros(1), fp8_dtype)
    x = x.detach().requires_grad_(requires_grad)
    return quantizer.quantize(x), x


def cast(x, scale, fp8_dtype=E4M3):
    limit = torch.finfo(fp8_dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(fp8_dtype)


class TestViews:
    def test_per_tensor_views_keep_the_codes(self):
        x8, _ = fp8(torch.randn(3, 4, 5, 6), 8.0)
        values = x8.dequantize()
        views = {
            "permute": (x8.permute(2, 0, 3, 1), values.permute(2, 0, 3, 1)),
            "transpose": (x8.transpose(1, 2), values.transpose(1, 2)),
            "permute_then_reshape": (x8.permute(1, 0, 2, 3).reshape(4, 90), values.permute(1, 0, 2, 3).reshape(4, 90)),
            "unsqueeze_squeeze": (x8.unsqueeze(2).squeeze(2), values),
            "squeeze_of_size_1": (x8[:, :1].squeeze(1), values[:, 0]),
        }
        for name, (got, want) in views.items():
            assert isinstance(got, Float8Tensor), name
            assert got.shape == want.shape, name
            assert torch.equal(got.dequantize(), want), name

    def test_cat_keeps_the_parts_of_one_cast(self):
        x8, _ = fp8(torch.randn(5, 12), 4.0)
        a, b, c = x8.split([3, 4, 5], dim=-1)
        joined = torch.cat([a, b, c], dim=-1)
        assert isinstance(joined, Float8Tensor)
        assert torch.equal(joined.dequantize(), x8.dequantize())
        y8, _ = fp8(torch.randn(5, 3), 2.0)  # another cast, another scale: the values are joined
        mixed = torch.cat([a, y8], dim=-1)
        assert not isinstance(mixed, Float8Tensor)
        assert torch.equal(mixed, torch.cat([a.dequantize(), y8.dequantize()], dim=-1))

    def test_block_scaled_permute_is_computed_on_the_values(self):
        quantizer = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=1)
        x = quantizer.quantize(torch.randn(4, 128))
        got = x.t()
        assert not isinstance(got, Float8Tensor)
        assert torch.equal(got, x.dequantize().t())


def _linear_in_region(lin, x, rec=recipe.DelayedScaling()):
    """lin's FP8 state made by one call, so that a test can set a slot's scale."""
    with te.autocast(recipe=rec):
        lin(x.detach())


class TestLinear:
    def test_reads_an_fp8_input_as_its_codes(self):
        torch.manual_seed(0)
        lin = te.Linear(32, 16, params_dtype=BF16)
        x = torch.randn(8, 32).to(BF16)
        x8, _ = fp8(x, 4.0)
        _linear_in_region(lin, x)
        meta = lin.fp8_meta.scaling_fwd
        meta.amax_history.zero_()
        with te.autocast(recipe=recipe.DelayedScaling()):
            taken = lin(x8)
            assert meta.amax_history[0, 0].item() == 0.0  # the input slot cast nothing
            meta.scale[0] = 4.0  # the same scale: casting x8's values again gives its codes
            recast = lin(x8.dequantize())
            assert meta.amax_history[0, 0].item() > 0.0
        assert torch.equal(taken, recast)

    def test_backward_reads_an_fp8_output_gradient_as_its_codes(self):
        torch.manual_seed(1)
        x = torch.randn(8, 32).to(BF16)
        grads = []
        for as_fp8 in (True, False):
            torch.manual_seed(2)
            lin = te.Linear(32, 16, params_dtype=BF16)
            _linear_in_region(lin, x)
            leaf = x.clone().requires_grad_()
            with te.autocast(recipe=recipe.DelayedScaling()):
                y = lin(leaf)
            g8, _ = fp8(torch.randn(8, 16), 2.0 ** 10, E5M2)
            lin.fp8_meta.scaling_bwd.scale[0] = 2.0 ** 10  # the grad-output slot's scale is g8's
            y.backward(g8 if as_fp8 else g8.dequantize())
            grads.append((leaf.grad, lin.weight.grad))
        assert torch.equal(grads[0][0], grads[1][0])
        assert torch.equal(grads[0][1], grads[1][1])


def _dpa():
    return te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")


def _qkv(b=2, s=24, h=4, g=2, d=16):
    torch.manual_seed(4)
    return torch.randn(b, s, h, d).to(BF16), torch.randn(b, s, g, d).to(BF16), torch.randn(b, s, g, d).to(BF16)


def _warm(m, q, k, v):
    """Two steps under DS: the slots' scales are no longer 1."""
    for _ in range(2):
        with te.autocast(recipe=DS):
            m(*(t.clone().requires_grad_() for t in (q, k, v))).sum().backward()


class TestDotProductAttention:
    def test_reads_fp8_q_k_v_as_their_codes(self):
        m = _dpa()
        q, k, v = _qkv()
        _warm(m, q, k, v)
        (q8, _), (k8, _), (v8, _) = fp8(q, 2.0), fp8(k, 8.0), fp8(v, 32.0)
        fwd = m.fp8_meta.scaling_fwd
        scale = fwd.scale.clone()
        fwd.amax_history.zero_()
        with te.autocast(recipe=DS):  # (the region's exit rolls the history: read it inside)
            out = m(q8, k8, v8)
            assert fwd.amax_history[0, slots.QKV].item() == 0.0  # q, k, v were not cast again
            assert fwd.amax_history[0, slots.O].item() > 0.0
        heads_first = [t.dequantize().transpose(1, 2) for t in (q8, k8, v8)]  # [b, s, h, d] -> [b, h, s, d]
        codes = [cast(t, s).to(BF16) for t, s in zip(heads_first, (2.0, 8.0, 32.0))]
        scales = torch.tensor([0.5, 0.125, 1 / 32, scale[slots.S].item(), 1 / scale[slots.S].item()])
        o32 = ops.flash_attention_fp8_fwd(*codes, None, None, None, None, None, None, None, None, None, None,
                                          16 ** -0.5, -1, 0, False, 0.0, False, scales)[0]
        o_scale = scale[slots.O]
        want = (cast(o32, o_scale).float() * torch.reciprocal(o_scale)).to(BF16).transpose(1, 2).reshape(2, 24, 64)
        assert torch.equal(out, want)

    def test_fp8_output_is_the_o_slots_cast(self):
        m = _dpa()
        q, k, v = _qkv()
        _warm(m, q, k, v)
        with te.autocast(recipe=DS):
            out8 = m(q, k, v, fp8_output=True)
            out = m(q, k, v)
        assert isinstance(out8, Float8Tensor) and out8.shape == out.shape == (2, 24, 64)
        assert torch.equal(out8.dequantize(), out)
        o_scale = m.fp8_meta.scaling_fwd.scale[slots.O:slots.O + 1]
        assert torch.equal(out8._scale_inv.reshape(1), torch.reciprocal(o_scale))

    def test_fp8_output_is_ignored_in_high_precision(self):
        out = _dpa()(*_qkv(), fp8_output=True)
        assert not isinstance(out, Float8Tensor)

    def test_reads_an_fp8_output_gradient_as_its_codes(self):
        q, k, v = _qkv()
        g8, _ = fp8(torch.randn(2, 24, 64), 2.0 ** 8, E5M2)
        grads = []
        for as_fp8 in (True, False):
            m = _dpa()
            _warm(m, q, k, v)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            with te.autocast(recipe=DS):
                out = m(*leaves, fp8_output=True)
            m.fp8_meta.scaling_bwd.scale[slots.DO] = 2.0 ** 8  # the dO slot's scale is g8's
            out.backward(g8 if as_fp8 else g8.dequantize())
            grads.append([t.grad for t in leaves])
        for got, want in zip(*grads):
            assert torch.equal(got, want)

    def test_fp8_inputs_get_fp8_gradients(self):
        """q, k, v split from one FP8 tensor (as MultiheadAttention's are): the gradient reaching
        it is one FP8 tensor, the dQKV slot's cast of dq, dk and dv, concatenated."""
        m = te.DotProductAttention(4, 16, qkv_format="sbhd", attn_mask_type="causal")
        mixed = torch.randn(24, 2, 3 * 64).to(BF16)
        mixed8, leaf = fp8(mixed, 1.0, requires_grad=True)  # a fresh module's slots' scale: recast, the same codes
        seen = []
        mixed8.register_hook(lambda grad: seen.append(grad))
        with te.autocast(recipe=DS):
            q, k, v = (t.view(24, 2, 4, 16) for t in mixed8.split(64, dim=-1))
            out = m(q, k, v)
            assert m.fp8_meta.scaling_fwd.amax_history[0, slots.QKV].item() == 0.0
        out.float().square().sum().backward()
        grad = seen[0]
        assert isinstance(grad, Float8Tensor) and grad.shape == mixed.shape
        assert torch.equal(leaf.grad, grad.dequantize())
        # the same gradients as the high-precision hand-off, cast by the same slot
        m2 = te.DotProductAttention(4, 16, qkv_format="sbhd", attn_mask_type="causal")
        plain = mixed8.dequantize().detach().requires_grad_()
        with te.autocast(recipe=DS):
            out2 = m2(*(t.view(24, 2, 4, 16) for t in plain.split(64, dim=-1)))
        out2.float().square().sum().backward()
        assert torch.equal(out2, out)
        assert torch.equal(plain.grad, leaf.grad)


def _mha(**kwargs):
    torch.manual_seed(5)
    return te.MultiheadAttention(64, 4, num_gqa_groups=2, params_dtype=BF16, attention_dropout=0.0,
                                 attn_mask_type="causal", fuse_qkv_params=True, **kwargs)


def _watch(mha):
    seen = {}

    def hook(module, args, kwargs, out):
        seen["qkv"] = [isinstance(t, Float8Tensor) for t in args[:3]]
        seen["out"] = isinstance(out, Float8Tensor)
    mha.core_attention.register_forward_hook(hook, with_kwargs=True)
    return seen


class TestMultiheadAttention:
    @pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "concatenated"])
    @pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
    def test_hands_fp8_between_gemms_and_attention(self, fmt, interleaved):
        mha = _mha(qkv_format=fmt, qkv_weight_interleaved=interleaved)
        seen = _watch(mha)
        x = torch.randn(12, 2, 64).to(BF16)
        for _ in range(3):
            leaf = x.clone().requires_grad_()
            with te.autocast(recipe=MHA_DS):
                y = mha(leaf)
            y.float().square().sum().backward()
        assert seen == {"qkv": [True, True, True], "out": True}
        assert mha.core_attention.last_backend == "fp8_flash"
        proj = mha.proj.fp8_meta.scaling_fwd.amax_history
        assert torch.all(proj[:, 0] == 0)  # the projection's input slot never cast: it read O's codes
        assert torch.all(mha.core_attention.fp8_meta.scaling_fwd.amax_history[:, slots.QKV] == 0)
        assert torch.isfinite(leaf.grad).all()
        with torch.no_grad():
            reference = mha(x)  # the high-precision module: within FP8's error
        assert (y.float() - reference.float()).abs().max() <= 0.25 * reference.float().abs().max()

    @pytest.mark.parametrize("case", ["fp8_dpa_only", "current_scaling", "rotary"])
    def test_what_stays_high_precision(self, case):
        """TE's rules: the QKV projection's output is FP8 only under fp8_mha, not under
        Float8CurrentScaling and not before RoPE; attention's output is FP8 whenever attention
        runs in FP8."""
        mha = _mha()
        seen = _watch(mha)
        rec, call = MHA_DS, {}
        if case == "fp8_dpa_only":
            rec = recipe.DelayedScaling(fp8_dpa=True)
        elif case == "current_scaling":
            rec = recipe.Float8CurrentScaling(fp8_dpa=True, fp8_mha=True)
        else:
            call = dict(rotary_pos_emb=te.RotaryPositionEmbedding(16)(12))
        x = torch.randn(12, 2, 64).to(BF16).requires_grad_()
        with te.autocast(recipe=rec):
            y = mha(x, **call)
        y.float().sum().backward()
        assert seen == {"qkv": [False, False, False], "out": True}
        assert torch.isfinite(x.grad).all()

    def test_cross_attention(self):
        mha = _mha(attention_type="cross")
        seen = _watch(mha)
        x, memory = torch.randn(12, 2, 64).to(BF16), torch.randn(7, 2, 64).to(BF16).requires_grad_()
        with te.autocast(recipe=MHA_DS):
            y = mha(x, encoder_output=memory)
        y.float().sum().backward()
        assert seen == {"qkv": [True, True, True], "out": True}
        assert torch.isfinite(memory.grad).all()
