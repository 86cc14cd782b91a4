"""DotProductAttention under fp8_dpa (attention/fp8_attention.py): the module's output equals the
FP8 ops between plain-PyTorch casts with its slots' scales, bit for bit; the six slots' amaxes
and scales after several steps are the recipe's formulas (DelayedScaling, and Float8CurrentScaling
with S and dP on delayed scales); the state survives a checkpoint; packed sequences, GQA, dropout,
sinks, bias and the layers above run it; gradients of q, k, v, the bias and the sinks."""
import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.attention import fp8_attention as slots

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ops = torch.ops.portable_te
DS = recipe.DelayedScaling(fp8_dpa=True, amax_history_len=1, amax_compute_algo="most_recent")
CS = recipe.Float8CurrentScaling(fp8_dpa=True)


def cast(x, scale, fp8_dtype):
    """x * scale on the FP8 grid (saturating), as codes."""
    limit = torch.finfo(fp8_dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(fp8_dtype)


def inputs(b=2, s=24, h=4, g=2, d=16, dtype=torch.bfloat16):
    q = torch.randn(b, s, h, d).to(dtype).requires_grad_()
    k, v = (torch.randn(b, s, g, d).to(dtype).requires_grad_() for _ in range(2))
    return q, k, v


def test_forward_is_the_fp8_ops_between_the_slots_casts():
    """bshd, causal, GQA; DelayedScaling after two steps (scales no longer 1): the output of
    step 3 from the slots' scales the module held before it, cast by plain PyTorch."""
    m = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = inputs()
    for _ in range(2):
        with te.autocast(recipe=DS):
            m(q, k, v).sum().backward()
    fwd = m.fp8_meta.scaling_fwd.scale.clone()
    with te.autocast(recipe=DS):
        out = m(q, k, v)
    assert m.last_backend == "fp8_flash"
    heads_first = [t.detach().transpose(1, 2) for t in (q, k, v)]  # [b, h, s, d]
    qkv_scale, o_scale, s_scale = fwd[slots.QKV], fwd[slots.O], fwd[slots.S]
    codes = [cast(t, qkv_scale, E4M3).to(torch.bfloat16) for t in heads_first]
    si = torch.reciprocal(qkv_scale).reshape(1)
    scales = torch.cat([si, si, si, s_scale.reshape(1), torch.reciprocal(s_scale).reshape(1)])
    o32 = ops.flash_attention_fp8_fwd(*codes, None, None, None, None, None, None, None, None, None, None,
                                      16 ** -0.5, -1, 0, False, 0.0, False, scales)[0]
    want = (cast(o32, o_scale, E4M3).float() * torch.reciprocal(o_scale)).to(torch.bfloat16)
    want = want.transpose(1, 2).reshape(2, 24, 64)  # [b, h, s, d] -> [b, s, h * d]
    assert torch.equal(out, want)


def _amax(*tensors):
    return max(t.detach().float().abs().max().item() for t in tensors)


@pytest.mark.parametrize("fp8_recipe", [DS, CS], ids=["delayed", "current"])
def test_slots_follow_the_recipe(fp8_recipe):
    """After each step (history 1, margin 0, so each scale is the format's max over the step's
    amax): QKV's from q, k and v together, S's from P (whose max is 1: a causal row's first
    query sees one key), dO's from the output gradient, dQKV's from the three gradients
    together (under current scaling their dequantised max is that amax, to bf16's rounding;
    delayed scaling cast them with the scale before); O and dP from their tensors. Under Float8CurrentScaling S and dP follow the same delayed formula."""
    m = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = inputs()
    for step in range(3):
        for t in (q, k, v):
            t.grad = None
        with te.autocast(recipe=fp8_recipe):
            out = m(q, k, v)
        grad = torch.randn_like(out)
        out.backward(grad)
        fwd, bwd = m.fp8_meta.scaling_fwd.scale, m.fp8_meta.scaling_bwd.scale
        assert m.fp8_meta.scaling_fwd.amax_history.shape == (1, 9)
        assert fwd[slots.QKV].item() == pytest.approx(448.0 / _amax(q, k, v), rel=1e-6)
        assert fwd[slots.S].item() == 448.0
        assert bwd[slots.DO].item() == pytest.approx(57344.0 / _amax(grad), rel=1e-6)
        if fp8_recipe is CS:  # cast with this step's scale: the largest gradient is the format's max
            assert bwd[slots.DQKV].item() == pytest.approx(57344.0 / _amax(q.grad, k.grad, v.grad), rel=2 ** -7)
        for scale in (fwd[slots.O], bwd[slots.DP], bwd[slots.DQKV]):
            assert 0 < scale.item() < float("inf") and scale.item() != 1.0
        assert torch.equal(m.fp8_meta.scaling_fwd.scale_inv, torch.reciprocal(m.fp8_meta.scaling_fwd.scale))


def test_state_survives_a_checkpoint():
    m = te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = inputs(g=4)
    for _ in range(2):
        with te.autocast(recipe=DS):
            m(q, k, v).sum().backward()
    state = m.state_dict()
    restored = te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    restored.load_state_dict(state)
    assert torch.equal(restored.fp8_meta.scaling_fwd.scale, m.fp8_meta.scaling_fwd.scale)
    assert torch.equal(restored.fp8_meta.scaling_bwd.scale, m.fp8_meta.scaling_bwd.scale)
    with te.autocast(recipe=DS):
        assert torch.equal(restored(q, k, v), m(q, k, v))


def _close_to_high_precision(fp8_out, hp_out, fp8_grads, hp_grads):
    """FP8 attention is within FP8's error of the high-precision module (E4M3: 2^-4 relative per
    value; a few of them in a row) - a sanity bound, the exact checks are above and in the ops' tests."""
    for got, want in [(fp8_out, hp_out)] + list(zip(fp8_grads, hp_grads)):
        if want is None:
            continue
        scale = want.detach().float().abs().max().item()
        assert (got.detach().float() - want.detach().float()).abs().max().item() <= 0.25 * scale + 1e-3


@pytest.mark.parametrize("case", ["thd_gqa", "dropout", "sink", "bias", "sbhd_padding"])
def test_features_run_in_fp8_with_their_gradients(case):
    torch.manual_seed(3)
    kwargs, call = dict(qkv_format="bshd", attn_mask_type="causal", num_gqa_groups=2), {}
    q, k, v = inputs(dtype=torch.float32)
    if case == "thd_gqa":
        kwargs = dict(qkv_format="thd", attn_mask_type="padding_causal", num_gqa_groups=2)
        cu = torch.tensor([0, 5, 5, 30], dtype=torch.int32)
        q = torch.randn(30, 4, 16).requires_grad_()
        k, v = (torch.randn(30, 2, 16).requires_grad_() for _ in range(2))
        call = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=25, max_seqlen_kv=25)
    elif case == "dropout":
        kwargs["attention_dropout"] = 0.1
    elif case == "sink":
        kwargs["softmax_type"] = "learnable"
    elif case == "bias":
        bias = torch.randn(1, 4, 24, 24, requires_grad=True)
        call = dict(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    elif case == "sbhd_padding":
        kwargs = dict(qkv_format="sbhd", attn_mask_type="padding", num_gqa_groups=2)
        q, k, v = (t.detach().transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v))
        call = dict(cu_seqlens_q=torch.tensor([0, 20, 44], dtype=torch.int32),
                    cu_seqlens_kv=torch.tensor([0, 20, 44], dtype=torch.int32))
    m = te.DotProductAttention(4, 16, **kwargs)
    leaves = [q, k, v] + [t for t in (call.get("core_attention_bias"), m.softmax_offset) if t is not None]
    with te.autocast(recipe=DS):
        out = m(q, k, v, **call)
    assert m.last_backend == "fp8_flash"
    fp8_grads = torch.autograd.grad(out.sum(), leaves)
    assert all(torch.isfinite(g).all() for g in fp8_grads)
    if case == "dropout":
        return  # its mask is the kernel's draw: nothing to compare with in high precision
    hp = m(q, k, v, **call)
    _close_to_high_precision(out, hp, fp8_grads, torch.autograd.grad(hp.sum(), leaves))


def test_layers_above_run_it():
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal")
    x = torch.randn(12, 2, 64, requires_grad=True)
    with te.autocast(recipe=recipe.DelayedScaling(fp8_dpa=True, fp8_mha=True)):
        y = layer(x)
    y.sum().backward()
    assert layer.self_attention.core_attention.last_backend == "fp8_flash"
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("fp8_mha", [False, True], ids=["fp8_dpa", "fp8_mha"])
@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_te_checkpoint_replays_with_the_forwards_scales(use_reentrant, fp8_mha):
    """A TransformerLayer recomputed by te.checkpoint under fp8_dpa (or fp8_mha, whose FP8
    tensors cross the projections) gives the gradients of the plain step, and leaves the
    attention's six slots as the plain step does."""
    reference = te.TransformerLayer(32, 64, 2, hidden_dropout=0.0, attention_dropout=0.0,
                                    self_attn_mask_type="causal")
    model = copy.deepcopy(reference)
    rec = recipe.DelayedScaling(fp8_dpa=True, fp8_mha=fp8_mha, amax_history_len=3)

    def step(layer, x, checkpointed):
        x = x.clone().requires_grad_()
        with te.autocast(recipe=rec):
            y = te.checkpoint(layer, x, use_reentrant=use_reentrant) if checkpointed else layer(x)
        y.sum().backward()
        return x.grad

    for k in range(3):
        x = torch.randn(8, 2, 32) * (k + 1)
        assert torch.equal(step(model, x, True), step(reference, x, False))
        ours = model.self_attention.core_attention.fp8_meta
        theirs = reference.self_attention.core_attention.fp8_meta
        for direction in ("scaling_fwd", "scaling_bwd"):
            for key in ("amax_history", "scale"):
                assert torch.equal(getattr(ours[direction], key), getattr(theirs[direction], key)), (k, direction, key)


def test_te_1_6_checkpoint_key_loads():
    """TE 1.6 kept the attention's FP8 state under `fused_attention._extra_state`: it loads as
    the module's own."""
    m = te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = inputs(g=4)
    with te.autocast(recipe=DS):
        m(q, k, v).sum().backward()
    state = m.state_dict()
    state["fused_attention._extra_state"] = state.pop("_extra_state")
    restored = te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    restored.load_state_dict(state)
    assert torch.equal(restored.fp8_meta.scaling_fwd.scale, m.fp8_meta.scaling_fwd.scale)
