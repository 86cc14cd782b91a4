"""The flash-attention ops (te.kernels.flash_attention) and the backend DotProductAttention picks
them through: forward and every gradient against the float64 reference over every mask
structure, GQA ratio, layout, head-dim pair and ALiBi setting; determinism; every SIMD tier; bad
inputs refused by name on every backend."""
import pytest
import torch

import transformer_engine.pytorch as te
from backends import assert_refused
from numerics import assert_close
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.attention.backends import (AttentionConfig, FlashBackend, SdpaBackend, UnfusedBackend,
                                                         selection)
from transformer_engine.pytorch.attention.masks import default_alibi_slopes
from transformer_engine.pytorch.custom_ops.attention import flash_attention

ops = torch.ops.portable_te


def _packed_lengths(lengths, gap):
    """cu_seqlens [b + 1] of `lengths`, and the padded starts with `gap` tokens after each."""
    cu, padded = [0], [0]
    for n in lengths:
        cu.append(cu[-1] + n)
        padded.append(padded[-1] + n + gap)
    return torch.tensor(cu, dtype=torch.int32), torch.tensor(padded, dtype=torch.int32)


def _check(q, k, v, window, bottom_right, dtype, cu=(None, None), padded=(None, None), slopes=None, scale=None):
    """Our op's out and (q, k, v) gradients against the float64 reference of the same call."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = flash_attention(*leaves, scale, window, bottom_right, cu[0], cu[1], padded[0], padded[1], slopes)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, grad_out)
    exact = [t.detach().to(dtype).double() for t in (q, k, v)]
    args = (cu[0], cu[1], padded[0], padded[1], slopes, scale, window[0], window[1], bottom_right)
    out_ref, lse_ref = reference.flash_attention_fwd(*exact, *args)
    # D = rowsum(grad_out * out) from the op's own out (rounded to bf16 there), as the op defines it.
    grads_ref = reference.flash_attention_bwd(grad_out.double(), *exact, out.detach().double(), lse_ref, *args)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert_close(out, out_ref, dtype=dtype, name="out")
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen), "rows that see no key have lse -inf, and only they"
    assert_close(lse[seen], lse_ref[seen], dtype=torch.float32, name="lse")
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), grads, grads_ref):
        assert_close(got, want, dtype=dtype, name=name)
    return out, grads


MASKS = {  # (window, bottom_right)
    "none": ((-1, -1), False),
    "causal": ((-1, 0), False),
    "causal_bottom_right": ((-1, 0), True),
    "window_causal": ((7, 0), True),
    "window_two_sided": ((5, 3), False),
    "window_right_only": ((-1, 4), True),
}
SHAPES = {  # (sq, skv)
    "square": (37, 37),
    "sq<skv": (37, 69),
    "sq>skv": (69, 37),
    "blocks": (130, 129),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS)
def test_padded_layout_every_mask(mask, shape, dtype):
    (sq, skv), (window, bottom_right) = SHAPES[shape], MASKS[mask]
    q, k, v = torch.randn(3, 4, sq, 24), torch.randn(3, 2, skv, 24), torch.randn(3, 2, skv, 16)
    _check(q, k, v, window, bottom_right, dtype)


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dims", [(64, 64), (48, 32), (192, 128)], ids=["64", "48/32", "mla_192/128"])
def test_gqa_ratios_and_head_dims(heads, groups, dims):
    q, k, v = torch.randn(2, heads, 70, dims[0]), torch.randn(2, groups, 70, dims[0]), torch.randn(2, groups, 70, dims[1])
    _check(q, k, v, (-1, 0), False, torch.float32)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes[h]", "slopes[b,h]"])
@pytest.mark.parametrize("mask", ["none", "causal_bottom_right", "window_two_sided"])
def test_alibi(mask, per_sequence):
    window, bottom_right = MASKS[mask]
    q, k, v = torch.randn(2, 4, 33, 16), torch.randn(2, 4, 41, 16), torch.randn(2, 4, 41, 16)
    slopes = torch.rand(2, 4) if per_sequence else default_alibi_slopes(4)
    _check(q, k, v, window, bottom_right, torch.float32, slopes=slopes)


@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right", "window_causal", "none"])
def test_padded_lengths(mask):
    """Sequences shorter than the tensor: rows past a length are zero, keys past it unseen."""
    window, bottom_right = MASKS[mask]
    q, k, v = torch.randn(3, 2, 40, 16), torch.randn(3, 2, 50, 16), torch.randn(3, 2, 50, 16)
    cu_q, cu_kv = torch.tensor([0, 40, 41, 41]), torch.tensor([0, 50, 57, 60])
    out, grads = _check(q, k, v, window, bottom_right, torch.float32, cu=(cu_q, cu_kv))
    assert not out[1, :, 1:].any() and not out[2].any(), "rows outside the sequences are zero"
    assert not grads[1][1, :, 7:].any() and not grads[2][1, :, 7:].any()


@pytest.mark.parametrize("gap", [0, 3], ids=["contiguous", "padded"])
@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right", "window_causal"])
def test_packed_sequences(mask, gap):
    """thd: empty and one-token sequences among longer ones, with and without gaps between them."""
    window, bottom_right = MASKS[mask]
    lengths_q, lengths_kv = [37, 0, 1, 70], [45, 3, 1, 64]
    cu_q, padded_q = _packed_lengths(lengths_q, gap)
    cu_kv, padded_kv = _packed_lengths(lengths_kv, gap)
    q = torch.randn(int(padded_q[-1]), 4, 16)
    k, v = torch.randn(int(padded_kv[-1]), 2, 16), torch.randn(int(padded_kv[-1]), 2, 8)
    padded = (padded_q, padded_kv) if gap else (None, None)
    out, _ = _check(q, k, v, window, bottom_right, torch.float32, cu=(cu_q, cu_kv), padded=padded)
    if gap:
        assert not out[37:40].any(), "tokens between sequences are zero"


def test_non_contiguous_views():
    """q, k, v as strided views of one fused projection [s, b, h, 3d], read without copies."""
    qkv = torch.randn(45, 2, 4, 3 * 16)
    q, k, v = (t.permute(1, 2, 0, 3) for t in qkv.split(16, dim=-1))  # [b, h, s, d] views
    assert not q.is_contiguous()
    _check(q, k, v, (-1, 0), False, torch.float32)


def test_rows_that_see_no_key_are_zero_without_nan():
    """A bottom-right causal mask with sq > skv and a window that leaves rows empty."""
    q, k, v = torch.randn(1, 2, 20, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    out, grads = _check(q, k, v, (-1, 0), True, torch.float32)
    assert not out[:, :, :15].any() and not grads[0][:, :, :15].any()


def test_cpu_tiers(cpu_tier):
    q, k, v = torch.randn(2, 4, 67, 40), torch.randn(2, 2, 67, 40), torch.randn(2, 2, 67, 24)
    _check(q, k, v, (9, 0), True, torch.float32, slopes=torch.rand(4))


def test_extreme_logits_keep_the_gradients_plain_pytorchs():
    """Logits near 300 and a one-hot softmax, with |grad_out| in the thousands: dS = P (dP - D)
    is a small difference of large terms there. The gradients must stay within a few times
    plain fp32 PyTorch's error (the backward takes no rounding of lse and forms D from the same
    products as dP)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 24, 8) * 16, torch.randn(1, 2, 24, 8) * 16, torch.randn(1, 2, 24, 8) * 4
    grad_out = torch.randn(1, 2, 24, 8) * 2000
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*exact, is_causal=True).backward(grad_out.double())
    plain = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*plain, is_causal=True).backward(grad_out)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*ours, 8 ** -0.5, (-1, 0), False)[0].backward(grad_out)
    for name, o, p, e in zip("qkv", ours, plain, exact):
        ours_error, plain_error = (o.grad - e.grad).abs().max().item(), (p.grad - e.grad).abs().max().item()
        assert ours_error <= 4 * plain_error + 1e-4, f"d{name}: {ours_error:.3g} vs plain PyTorch's {plain_error:.3g}"


def test_backward_is_deterministic_whatever_the_thread_count():
    q, k, v = (torch.randn(2, 4, 150, 32, requires_grad=True) for _ in range(3))
    k2, v2 = k[:, :2].detach().requires_grad_(), v[:, :2].detach().requires_grad_()
    results = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            out, _ = flash_attention(q, k2, v2, 0.2, (31, 0), True)
            results.append((out, *torch.autograd.grad(out, (q, k2, v2), torch.ones_like(out))))
    finally:
        torch.set_num_threads(previous)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


def _i(*values):
    return torch.tensor(values, dtype=torch.int32)


FWD = ops.flash_attention_fwd
BAD_INPUTS = [
    (lambda: FWD(_t(2, 4, 8, 16, dtype=torch.int64), _t(2, 4, 8, 16), _t(2, 4, 8, 16), None, None, None, None, None,
                 1.0, -1, -1, False), ["flash_attention_fwd", "q", "float32, bfloat16 or float16", "Long"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 16, dtype=torch.bfloat16), _t(2, 4, 8, 16), None, None, None, None,
                 None, 1.0, -1, -1, False), ["k", "BFloat16", "Float"], False),
    (lambda: FWD(_t(2, 4, 8), _t(2, 4, 8), _t(2, 4, 8), None, None, None, None, None, 1.0, -1, -1, False),
     ["packed (3-D) q, k, v need cu_seqlens_q and cu_seqlens_kv"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 3, 8, 16), _t(2, 3, 8, 16), None, None, None, None, None, 1.0, -1, -1, False),
     ["key/value heads", "[2, 3, 8, 16]", "must divide", "[2, 4, 8, 16]"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 12), _t(2, 4, 8, 16), None, None, None, None, None, 1.0, -1, -1, False),
     ["k's head dim 12", "q's 16"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 9, 16), _t(2, 4, 8, 16), None, None, None, None, None, 1.0, -1, -1, False),
     ["k [2, 4, 9, 16]", "v [2, 4, 8, 16]", "all but the head dim"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(3, 4, 8, 16), _t(3, 4, 8, 16), None, None, None, None, None, 1.0, -1, -1, False),
     ["same batch"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16), None, None, None, None, None, 1.0, -2, 0, False),
     ["window bounds", "(-2, 0)"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16), None, None, None, None, _t(3), 1.0, -1, -1,
                 False), ["alibi_slopes", "[heads] = [4]", "[3]"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16), _i(0, 8, 16), None, None, None, None, 1.0, -1,
                 -1, False), ["give both cu_seqlens_q and cu_seqlens_kv"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16), _i(0, 8), _i(0, 8), None, None, None, 1.0, -1,
                 -1, False), ["cu_seqlens_q", "3 entries", "[2]"], False),
    (lambda: FWD(_t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16), _i(0, 8, 17), _i(0, 8, 16), None, None, None,
                 1.0, -1, -1, False), ["sequence 1 of q", "9 tokens", "8 rows"], True),
    (lambda: FWD(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), _i(0, 6, 10), _i(0, 5, 10), _i(0, 5, 10), None, None,
                 1.0, -1, -1, False), ["sequence 0 of q", "6 tokens from token 0", "slot"], True),
    (lambda: FWD(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), _i(1, 6, 10), _i(0, 5, 10), None, None, None, 1.0, -1,
                 -1, False), ["cu_seqlens_q", "start at 0"], True),
    (lambda: FWD(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), _i(0, 6, 4), _i(0, 5, 10), None, None, None, 1.0, -1,
                 -1, False), ["cu_seqlens_q", "non-decreasing"], True),
    (lambda: ops.flash_attention_bwd(_t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16),
                                     _t(2, 4, 8, 16), _t(2, 4, 8), None, None, None, None, None, 1.0, -1, -1, False),
     ["flash_attention_bwd", "lse", "Float", "Double"], False),
    (lambda: ops.flash_attention_bwd(_t(2, 4, 8, 15), _t(2, 4, 8, 16), _t(2, 4, 8, 16), _t(2, 4, 8, 16),
                                     _t(2, 4, 8, 16), _t(2, 4, 8, dtype=torch.float64), None, None, None, None, None,
                                     1.0, -1, -1, False), ["grad_out", "[2, 4, 8, 15]", "[2, 4, 8, 16]"], False),
]


@pytest.mark.parametrize("call,words,reads_values", BAD_INPUTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error_naming_argument(backend, call, words, reads_values):
    assert_refused(backend, call, words, on_meta=not reads_values)


# --- DotProductAttention on the flash backend ---------------------------------------------------

def _attend(module, preference, *args, **kwargs):
    saved = selection.PREFERENCE
    selection.PREFERENCE = preference
    try:
        leaves = [t.clone().requires_grad_() for t in args]
        out = module(*leaves, **kwargs)
        out.backward(torch.ones_like(out))
        return module.last_backend, out, [t.grad for t in leaves]
    finally:
        selection.PREFERENCE = saved


CALLS = {
    "sliding_window": dict(attn_mask_type="causal", window_size=(5, 0)),
    "bottom_right": dict(attn_mask_type="causal_bottom_right"),
    "two_sided_window": dict(attn_mask_type="no_mask", window_size=(4, 2)),
    "alibi": dict(attn_mask_type="causal", bias="alibi"),
    "padding": dict(attn_mask_type="padding_causal", padding=True),
}


@pytest.mark.parametrize("call", CALLS)
def test_dot_product_attention_runs_flash_and_agrees_with_unfused(call):
    options = dict(CALLS[call])
    padding, bias = options.pop("padding", False), options.pop("bias", None)
    m = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", **options)
    q, k, v = torch.randn(2, 19, 4, 16), torch.randn(2, 23, 2, 16), torch.randn(2, 23, 2, 16)
    kwargs = {}
    if padding:
        kwargs["cu_seqlens_q"], kwargs["cu_seqlens_kv"] = _i(0, 19, 30), _i(0, 23, 35)
    if bias:
        kwargs["core_attention_bias_type"] = bias
    name, out, grads = _attend(m, selection.PREFERENCE, q, k, v, **kwargs)
    assert name == "flash"
    _, out_ref, grads_ref = _attend(m, (UnfusedBackend(),), q, k, v, **kwargs)
    assert_close(out, out_ref, dtype=torch.float32, name="out")
    for g, r in zip(grads, grads_ref):
        assert_close(g, r, dtype=torch.float32, name="grad")


def test_packed_dot_product_attention_runs_flash():
    m = te.DotProductAttention(4, 16, qkv_format="thd", attn_mask_type="padding_causal")
    cu = _i(0, 5, 5, 17)
    q, k, v = (torch.randn(17, 4, 16) for _ in range(3))
    name, out, _ = _attend(m, selection.PREFERENCE, q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert name == "flash"
    _, out_ref, _ = _attend(m, (SdpaBackend(),), q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert_close(out, out_ref, dtype=torch.float32, name="out")


@pytest.mark.parametrize("call,reason", [
    (dict(attn_mask_type="arbitrary"), "structure"),
    (dict(attention_dropout=0.1), "dropout"),
    (dict(softmax_type="off-by-one"), "sink"),
])
def test_flash_refuses_what_it_lacks_with_its_reason(call, reason):
    m = te.DotProductAttention(2, 8, qkv_format="bshd", **call)
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    mask = torch.rand(1, 1, 6, 6) > 0.5 if call.get("attn_mask_type") == "arbitrary" else None
    m(q, k, v, attention_mask=mask)
    assert m.last_backend in ("sdpa", "unfused")
    config = dict(dtype=torch.float32, device_type="cpu", num_heads=2, num_gqa_groups=2, head_dim_qk=8, head_dim_v=8,
                  causal="none", has_mask=False, has_bias=False, dropout=0.0, structured_mask=True)
    refused = {"structure": dict(structured_mask=False), "dropout": dict(dropout=0.1), "sink": dict(has_sink=True)}
    config.update(refused[reason])
    assert reason in FlashBackend().supports(AttentionConfig(**config))


def test_padding_mask_with_holes_falls_back():
    """A user's padding mask that pads the front of a sequence is not a length: not flash."""
    m = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="padding")
    pad = torch.zeros(1, 1, 1, 6, dtype=torch.bool)
    pad[..., 0] = True  # left padding
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    m(q, k, v, attention_mask=pad)
    assert m.last_backend == "sdpa"
    pad = torch.zeros(1, 1, 1, 6, dtype=torch.bool)
    pad[..., 4:] = True  # right padding
    m(q, k, v, attention_mask=pad)
    assert m.last_backend == "flash"
