"""The flash-attention ops (te.kernels.flash_attention) and the backend DotProductAttention picks
them through: forward and every gradient against the float64 reference over every mask
structure, GQA ratio, layout, head-dim pair and ALiBi setting; determinism; every SIMD tier; bad
inputs refused by name on every backend."""
import pytest
import torch

import transformer_engine.pytorch as te
from backends import assert_refused
from flash_attention_check import check_flash as _check, fwd_args
from numerics import assert_close
from op_cases import BF16, F32, OpCases, randn
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


# (batch, heads, kv heads, sq, skv, causal): query blocks of more than 16 rows (scores as a tile
# product with K^T), a last block of 6 rows (dot products of rows), grouped query heads
# decoding (rows of several heads in one task, dot products).
EXTREME_SHAPES = {"block_24": (1, 2, 2, 24, 24, True), "last_block_6": (1, 2, 2, 70, 70, True),
                  "gqa_rows_7": (3, 4, 2, 7, 7, True), "decode_gqa": (2, 8, 2, 1, 40, False)}


@pytest.mark.parametrize("shape", EXTREME_SHAPES)
def test_extreme_logits_keep_the_gradients_plain_pytorchs(shape):
    """Logits near 300 and a one-hot softmax, with |grad_out| in the thousands: dS = P (dP - D)
    is a small difference of large terms there. The gradients must stay within a few times
    plain fp32 PyTorch's error (the backward takes no rounding of lse, recomputes each score
    with the forward's rounding, and forms D from the same products as dP), whichever way the
    scores are computed. Each error is the largest over 8 draws: in one draw it comes from a few
    cancellations, and how their scores happen to round (which differs with the order of a
    score's sums) moves it by a few times either way."""
    b, h, g, sq, skv, causal = EXTREME_SHAPES[shape]
    errors = {name: [0.0, 0.0] for name in "qkv"}  # ours, plain PyTorch's
    for seed in range(8):
        torch.manual_seed(seed)
        q, k, v = torch.randn(b, h, sq, 8) * 16, torch.randn(b, g, skv, 8) * 16, torch.randn(b, g, skv, 8) * 4
        grad_out = torch.randn(b, h, sq, 8) * 2000
        exact = [t.double().requires_grad_() for t in (q, k, v)]
        torch.nn.functional.scaled_dot_product_attention(*exact, is_causal=causal, enable_gqa=True).backward(
            grad_out.double())
        plain = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.nn.functional.scaled_dot_product_attention(*plain, is_causal=causal, enable_gqa=True).backward(grad_out)
        ours = [t.clone().requires_grad_() for t in (q, k, v)]
        flash_attention(*ours, 8 ** -0.5, (-1, 0) if causal else (-1, -1), False)[0].backward(grad_out)
        for name, o, p, e in zip("qkv", ours, plain, exact):
            for i, x in enumerate((o, p)):
                errors[name][i] = max(errors[name][i], (x.grad - e.grad).abs().max().item())
    for name, (ours_error, plain_error) in errors.items():
        assert ours_error <= 4 * plain_error + 1e-4, f"d{name}: {ours_error:.3g} vs plain PyTorch's {plain_error:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [8, 32, 37])
@pytest.mark.parametrize("shape", EXTREME_SHAPES)
def test_extreme_logits_leave_one_hot_rows_without_gradient_noise(shape, head_dim, dtype, cpu_tier):
    """Each query a multiple of one key, so that every softmax row is one-hot at logits in the
    thousands. There out is that key's value row bit for bit, dP - D is exactly 0 and q, k get
    no gradient at all; a score recomputed with another rounding than the forward's (whose few
    query rows read the keys where they lie, the backward's its packed copy of them; with bf16
    inputs on AVX512-BF16, the dot-product path), or a D summed in another order than dP,
    leaves noise of |dO| |v| times an ulp there. A head dim of 37 ends in a part of a vector."""
    b, h, g, sq, skv, causal = EXTREME_SHAPES[shape]
    d = head_dim
    torch.manual_seed(0)
    # Keys of signs: the chosen key's logit is m sqrt(d) (362 at d = 32), the others' a few
    # standard deviations (m) below it or, at d = 8, where keys share most signs, at least a
    # quarter of it (181) below, so exp underflows to 0 for every other key.
    m = 64 if d >= 32 else 256
    k = torch.randint(0, 2, (b, g, skv, d)) * 2 - 1
    k[:, :, 1:, 0] = -k[:, :, :1, 0]  # no other key equal to key 0
    k = k.to(dtype)
    chosen = torch.arange(sq) % (1 if causal else skv)  # query t picks key 0 (causal rows all see it)
    q = k.repeat_interleave(h // g, dim=1)[:, :, chosen] * m
    v, grad_out = torch.randn(b, g, skv, d).to(dtype), (torch.randn(b, h, sq, d) * 100).to(dtype)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*ours, d ** -0.5, (-1, 0) if causal else (-1, -1), False)[0]
    out.backward(grad_out)
    picked = v.repeat_interleave(h // g, dim=1)[:, :, chosen]
    assert torch.equal(out, picked)
    assert not ours[0].grad.any() and not ours[1].grad.any()
    expected_dv = torch.zeros(b, h, skv, d, dtype=torch.float64).index_add_(2, chosen, grad_out.double())
    assert_close(ours[2].grad.double(), expected_dv.unflatten(1, (g, h // g)).sum(2), rtol=2 ** -8, atol=1e-6)


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


def _fwd(*tensors, **options):
    return ops.flash_attention_fwd(*fwd_args(*tensors, **options))


def _bwd(grad_out, q, k, v, out, lse, **options):
    args = fwd_args(q, k, v, **options)
    return ops.flash_attention_bwd(grad_out, *args[:3], out, lse, *args[3:])


Q = (2, 4, 8, 16)
BAD_INPUTS = [
    (lambda: _fwd(_t(*Q, dtype=torch.int64), _t(*Q), _t(*Q)),
     ["flash_attention_fwd", "q", "float32, bfloat16 or float16", "Long"], False),
    (lambda: _fwd(_t(*Q), _t(*Q, dtype=torch.bfloat16), _t(*Q)), ["k", "BFloat16", "Float"], False),
    (lambda: _fwd(_t(2, 4, 8), _t(2, 4, 8), _t(2, 4, 8)), ["packed (3-D) q, k, v need cu_seqlens_q and cu_seqlens_kv"],
     False),
    (lambda: _fwd(_t(*Q), _t(2, 3, 8, 16), _t(2, 3, 8, 16)),
     ["key/value heads", "[2, 3, 8, 16]", "must divide", "[2, 4, 8, 16]"], False),
    (lambda: _fwd(_t(*Q), _t(2, 4, 8, 12), _t(*Q)), ["k's head dim 12", "q's 16"], False),
    (lambda: _fwd(_t(*Q), _t(2, 4, 9, 16), _t(*Q)), ["k [2, 4, 9, 16]", "v [2, 4, 8, 16]", "all but the head dim"],
     False),
    (lambda: _fwd(_t(*Q), _t(3, 4, 8, 16), _t(3, 4, 8, 16)), ["same batch"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), window=(-2, 0)), ["window bounds", "(-2, 0)"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), alibi_slopes=_t(3)), ["alibi_slopes", "[heads] = [4]", "[3]"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), cu_seqlens_q=_i(0, 8, 16)), ["give both cu_seqlens_q and cu_seqlens_kv"],
     False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), cu_seqlens_q=_i(0, 8), cu_seqlens_kv=_i(0, 8)),
     ["cu_seqlens_q", "3 entries", "[2]"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), cu_seqlens_q=_i(0, 8, 17), cu_seqlens_kv=_i(0, 8, 16)),
     ["sequence 1 of q", "9 tokens", "8 rows"], True),
    (lambda: _fwd(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), cu_seqlens_q=_i(0, 6, 10), cu_seqlens_kv=_i(0, 5, 10),
                  cu_seqlens_q_padded=_i(0, 5, 10)), ["sequence 0 of q", "6 tokens from token 0", "slot"], True),
    (lambda: _fwd(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), cu_seqlens_q=_i(1, 6, 10), cu_seqlens_kv=_i(0, 5, 10)),
     ["cu_seqlens_q", "start at 0"], True),
    (lambda: _fwd(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), cu_seqlens_q=_i(0, 6, 4), cu_seqlens_kv=_i(0, 5, 10)),
     ["cu_seqlens_q", "non-decreasing"], True),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), bias=_t(2, 4, 8, 16, dtype=torch.bfloat16)), ["bias", "BFloat16", "Float"],
     False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), bias=_t(1, 4, 8, 9)),
     ["bias", "[1 or batch, 1 or heads, sq, skv] = [1 or 2, 1 or 4, 8, 8]", "[1, 4, 8, 9]"], False),
    (lambda: _fwd(_t(10, 4, 16), _t(10, 4, 16), _t(10, 4, 16), cu_seqlens_q=_i(0, 10), cu_seqlens_kv=_i(0, 10),
                  bias=_t(1, 4, 10, 10)), ["bias", "not packed"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), mask=_t(2, 1, 8, 8)), ["mask", "Bool", "Float"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), mask=_t(3, 1, 8, 8, dtype=torch.bool)), ["mask", "[3, 1, 8, 8]"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), softmax_offset=_t(2)), ["softmax_offset", "[4]", "[2]"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), softmax_offset=_t(4, dtype=torch.float64)),
     ["softmax_offset", "Double", "Float"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), softcap=-1.0), ["softcap", "-1"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), softcap=float("inf")), ["softcap", "inf"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), dropout=1.0), ["dropout must be in [0, 1)", "1"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), dropout=0.1), ["dropout 0.1 needs dropout_rng"], False),
    (lambda: _fwd(_t(*Q), _t(*Q), _t(*Q), dropout=0.1, dropout_rng=_i(1, 2)), ["dropout_rng", "Int", "Long"], False),
    (lambda: _bwd(_t(*Q), _t(*Q), _t(*Q), _t(*Q), _t(*Q), _t(2, 4, 8)),
     ["flash_attention_bwd", "lse", "Float", "Double"], False),
    (lambda: _bwd(_t(2, 4, 8, 15), _t(*Q), _t(*Q), _t(*Q), _t(*Q), _t(2, 4, 8, dtype=torch.float64)),
     ["grad_out", "[2, 4, 8, 15]", "[2, 4, 8, 16]"], False),
    (lambda: _bwd(_t(*Q), _t(*Q), _t(*Q), _t(*Q), _t(*Q), _t(2, 4, 8, dtype=torch.float64), last=True),
     ["bias_grad needs a bias"], False),
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
        bias = kwargs.get("core_attention_bias")
        if bias is not None:
            kwargs = dict(kwargs, core_attention_bias=bias.clone().requires_grad_())
            leaves.append(kwargs["core_attention_bias"])
        out = module(*leaves[:3], **kwargs)
        logit = None
        if isinstance(out, tuple):
            out, logit = out
        out.backward(torch.ones_like(out))
        params = [p.grad for p in module.parameters()]
        return module.last_backend, out, [t.grad for t in leaves] + params, logit
    finally:
        selection.PREFERENCE = saved


CALLS = {
    "sliding_window": dict(attn_mask_type="causal", window_size=(5, 0)),
    "bottom_right": dict(attn_mask_type="causal_bottom_right"),
    "two_sided_window": dict(attn_mask_type="no_mask", window_size=(4, 2)),
    "alibi": dict(attn_mask_type="causal", bias="alibi"),
    "padding": dict(attn_mask_type="padding_causal", padding=True),
    "padding_with_holes": dict(attn_mask_type="padding", holes=True),
    "arbitrary": dict(attn_mask_type="arbitrary", arbitrary=True),
    "post_scale_bias": dict(attn_mask_type="causal", bias="post_scale_bias"),
    "pre_scale_bias_window": dict(attn_mask_type="no_mask", window_size=(3, 3), bias="pre_scale_bias"),
    "off_by_one_sink": dict(attn_mask_type="causal", softmax_type="off-by-one"),
    "learnable_sink_max_logit": dict(attn_mask_type="padding_causal", padding=True, softmax_type="learnable",
                                     return_max_logit=True),
}


@pytest.mark.parametrize("call", CALLS)
def test_dot_product_attention_runs_flash_and_agrees_with_unfused(call):
    options = dict(CALLS[call])
    padding, bias = options.pop("padding", False), options.pop("bias", None)
    holes, arbitrary = options.pop("holes", False), options.pop("arbitrary", False)
    torch.manual_seed(0)
    m = te.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", **options)
    if options.get("softmax_type") == "learnable":
        torch.nn.init.normal_(m.softmax_offset)
    sq, skv = (19, 19) if holes else (19, 23)
    q, k, v = torch.randn(2, sq, 4, 16), torch.randn(2, skv, 2, 16), torch.randn(2, skv, 2, 16)
    kwargs = {}
    if padding:
        kwargs["cu_seqlens_q"], kwargs["cu_seqlens_kv"] = _i(0, 19, 30), _i(0, 23, 35)
    if holes:  # the first token of sequence 0 and the last three of sequence 1 padded
        pad = torch.zeros(2, 1, 1, sq, dtype=torch.bool)
        pad[0, ..., 0] = pad[1, ..., -3:] = True
        kwargs["attention_mask"] = pad
    if arbitrary:
        kwargs["attention_mask"] = torch.rand(2, 1, sq, skv) > 0.6
    if bias == "alibi":
        kwargs["core_attention_bias_type"] = bias
    elif bias is not None:
        kwargs["core_attention_bias_type"] = bias
        kwargs["core_attention_bias"] = torch.randn(1, 4, sq, skv)
    name, out, grads, logit = _attend(m, selection.PREFERENCE, q, k, v, **kwargs)
    assert name == "flash"
    _, out_ref, grads_ref, logit_ref = _attend(m, (UnfusedBackend(),), q, k, v, **kwargs)
    assert_close(out, out_ref, dtype=torch.float32, name="out")
    for g, r in zip(grads, grads_ref):
        assert_close(g, r, dtype=torch.float32, name="grad")
    if logit is not None:
        assert_close(logit, logit_ref, dtype=torch.float32, name="max_logit")


def test_packed_dot_product_attention_runs_flash():
    m = te.DotProductAttention(4, 16, qkv_format="thd", attn_mask_type="padding_causal")
    cu = _i(0, 5, 5, 17)
    q, k, v = (torch.randn(17, 4, 16) for _ in range(3))
    name, out, _, _ = _attend(m, selection.PREFERENCE, q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert name == "flash"
    _, out_ref, _, _ = _attend(m, (SdpaBackend(),), q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert_close(out, out_ref, dtype=torch.float32, name="out")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dot_product_attention_hands_16_bit_inputs_to_the_kernel_as_they_are(dtype):
    """No fp32 copy of q, k, v first: the module's output is the op's on the 16-bit tensors, bit for bit."""
    m = te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = (torch.randn(2, 33, 4, 16, dtype=dtype) for _ in range(3))
    out = m(q, k, v)
    assert m.last_backend == "flash"
    want, _ = flash_attention(*(t.transpose(1, 2) for t in (q, k, v)), 16 ** -0.5, (-1, 0), False)
    assert torch.equal(out, want.transpose(1, 2).reshape(2, 33, 64))


def test_dot_product_attention_dropout_on_flash_follows_the_seed():
    """Dropout runs in the kernel, keyed by a draw from torch's generator: the same seed gives the
    same output and gradients, another seed another mask; eval mode has no dropout."""
    m = te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal", attention_dropout=0.3)
    q, k, v = (torch.randn(2, 40, 4, 16) for _ in range(3))
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        name, out, grads, _ = _attend(m, selection.PREFERENCE, q, k, v)
        assert name == "flash"
        runs.append([out] + grads)
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not torch.equal(runs[0][0], runs[2][0])
    m.eval()
    assert torch.equal(m(q, k, v), te.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")(q, k, v))


def test_flash_refuses_other_devices_and_dtypes_with_the_reason():
    config = dict(dtype=torch.float32, device_type="cpu", num_heads=2, num_gqa_groups=2, head_dim_qk=8, head_dim_v=8,
                  causal="none", has_mask=True, has_bias=True, dropout=0.1, has_sink=True, has_alibi=True)
    assert FlashBackend().supports(AttentionConfig(**config)) is None
    assert "runs on the CPU, CUDA and MUSA" in FlashBackend().supports(AttentionConfig(**dict(config, device_type="xpu")))
    assert "takes no bias tensor" in FlashBackend().supports(AttentionConfig(**dict(config, device_type="cuda")))
    assert "float64" in FlashBackend().supports(AttentionConfig(**dict(config, dtype=torch.float64)))
    assert "head dims up to 1024" in FlashBackend().supports(AttentionConfig(**dict(config, head_dim_v=2048)))


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("attention")


def _attention(d, dtype=BF16, grad=False):
    """q [2, 4, 9, 16], k [2, 2, 11, 16], v [2, 2, 11, 8]: GQA, sq != skv, dk != dv."""
    return (randn(d, 2, 4, 9, 16, dtype=dtype, grad=grad), randn(d, 2, 2, 11, 16, dtype=dtype, grad=grad),
            randn(d, 2, 2, 11, 8, dtype=dtype, grad=grad))


def _packed_attention(d):
    """Packed q [12, 2, 8], k / v [14, 2, 8]: three sequences with a gap, ALiBi."""
    q, k, v = (randn(d, n, 2, 8, dtype=F32, grad=True) for n in (12, 14, 14))
    cu_q, cu_kv = torch.tensor([0, 5, 5, 9], device=d), torch.tensor([0, 4, 7, 12], device=d)
    padded_q, padded_kv = torch.tensor([0, 6, 6, 12], device=d), torch.tensor([0, 4, 8, 14], device=d)
    return q, k, v, cu_q, cu_kv, padded_q, padded_kv, torch.rand(2, device=d)


# flash_attention_fwd's arguments after the sequences and ALiBi (bias, mask, softmax_offset,
# dropout_rng, page_table) and after the scale (window, bottom_right, softcap, dropout,
# return_max_logit).
_NO_TERMS = (None, None, None, None, None)


@CASES.case("flash_attention_fwd")
def _(d):
    return (*_attention(d), None, None, None, None, None, *_NO_TERMS, 0.25, -1, 0, True, 0.0, 0.0, False), ()


@CASES.case("flash_attention_bwd")
def _(d):
    q, k, v = _attention(d)
    out, lse, _ = ops.flash_attention_fwd(q, k, v, None, None, None, None, None, *_NO_TERMS, 0.25, -1, 0, True, 0.0,
                                          0.0, False)
    return (randn(d, *out.shape), q, k, v, out, lse, None, None, None, None, None, *_NO_TERMS, 0.25, -1, 0, True,
            0.0, 0.0, False), ()


@CASES.case("flash_attention_fwd[fp32, window, lengths]")
def _(d):
    cu = torch.tensor([0, 9, 14], device=d), torch.tensor([0, 11, 14], device=d)
    return (*_attention(d, F32, grad=True), *cu, None, None, None, *_NO_TERMS, 0.25, 3, 2, False, 0.0, 0.0, True), ()


@CASES.case("flash_attention_fwd[fp32, packed, alibi]")
def _(d):
    return (*_packed_attention(d), *_NO_TERMS, 0.3, -1, 0, True, 0.0, 0.0, False), ()


@CASES.case("flash_attention_bwd[fp32, packed, alibi]", compile=False)
def _(d):
    q, k, v, *rest = _packed_attention(d)
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse, _ = ops.flash_attention_fwd(q, k, v, *rest, *_NO_TERMS, 0.3, -1, 0, True, 0.0, 0.0, False)
    return (torch.randn_like(out), q, k, v, out, lse, *rest, *_NO_TERMS, 0.3, -1, 0, True, 0.0, 0.0, False), ()


def _attention_terms(d, dtype):
    """bias [1, 4, 9, 11], mask [2, 1, 9, 11], sinks [4], dropout's (seed, offset), no page table."""
    return (randn(d, 1, 4, 9, 11, dtype=dtype, grad=True), torch.rand(2, 1, 9, 11, device=d) > 0.7,
            randn(d, 4, dtype=F32, grad=True), torch.tensor([11, 3], device=d), None)


@CASES.case("flash_attention_fwd[bf16, bias, mask, sink, softcap, dropout, max logit]")
def _(d):
    return (*_attention(d, grad=True), None, None, None, None, None, *_attention_terms(d, BF16), 0.25, -1, 0, True,
            5.0, 0.2, True), ()


@CASES.case("flash_attention_bwd[fp32, bias, mask, sink, softcap, dropout]", compile=False)
def _(d):
    q, k, v = _attention(d, F32)
    terms = tuple(None if t is None else t.detach() for t in _attention_terms(d, F32))
    out, lse, _ = ops.flash_attention_fwd(q, k, v, None, None, None, None, None, *terms, 0.25, 4, 0, False, 5.0, 0.2,
                                          False)
    return (torch.randn_like(out), q, k, v, out, lse, None, None, None, None, None, *terms, 0.25, 4, 0, False, 5.0,
            0.2, True), ()


@CASES.case("flash_attention_fwd[bf16, paged cache, decode]")
def _(d):
    """q [2, 4, 1, 16] against a paged cache of 6 pages of 4 tokens, sequences of 7 and 3 keys."""
    q = randn(d, 2, 4, 1, 16)
    k_pages, v_pages = randn(d, 6, 4, 2, 16), randn(d, 6, 4, 2, 8)
    table = torch.tensor([[4, 1, 0], [2, 0, 0]], dtype=torch.int32, device=d)
    cu_q, cu_kv = torch.tensor([0, 1, 2], device=d), torch.tensor([0, 7, 10], device=d)
    return (q, k_pages, v_pages, cu_q, cu_kv, None, None, None, None, None, None, None, table, 0.25, -1, 0, True, 0.0,
            0.0, False), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
