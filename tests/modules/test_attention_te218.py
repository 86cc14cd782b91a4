"""TE 2.18's attention options: check_set_window_size's rule, bottom_right_diagonal, the mask
spellings, attention sinks (softmax_type), return_max_logit, pad_between_seqs and the forward's
backend hints, the FP8-attention warning, and get_attention_backend answering from the real
selection."""
import contextlib
import logging
import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.attention import masks
from transformer_engine.pytorch.attention.backends import selection
from transformer_engine.pytorch.attention.dot_product_attention import call_options
from transformer_engine.pytorch.attention.dot_product_attention.utils import (AttentionParams, FlashAttentionUtils,
                                                                              check_set_window_size,
                                                                              get_attention_backend)
from attention_cases import (BACKENDS, B, D, H, attention_backend, check, dense_case,  # noqa: F401 (a fixture)
                             run_dense)
from attention_reference import attention, keep_matrix
from numerics import assert_close, assert_value_error_naming


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# --- check_set_window_size: TE 2.18's table ------------------------------------------------------

CAUSAL_TYPES = ["causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"]
OTHER_TYPES = ["no_mask", "padding", "arbitrary"]


@pytest.mark.parametrize("mask_type", CAUSAL_TYPES + OTHER_TYPES)
@pytest.mark.parametrize("window,causal_answer,other_answer", [
    (None, ((-1, 0), False), ((-1, -1), False)),
    ((-1, 0), ((-1, 0), False), ((-1, -1), True)),
    ((-1, -1), ((-1, 0), True), ((-1, -1), False)),
    ((4, 0), ((4, 0), False), ((4, 0), False)),
    ((4, 2), ((4, 0), True), ((4, 2), False)),
    ((0, 3), ((0, 0), True), ((0, 3), False)),
    ((-1, 3), "error", "error"),
    ((3, -1), ((3, 0), True), "error"),
    ((-2, 0), "error", "error"),
], ids=str)
def test_check_set_window_size_follows_te(mask_type, window, causal_answer, other_answer):
    answer = causal_answer if "causal" in mask_type else other_answer
    if answer == "error":
        with pytest.raises(ValueError, match=r"window_size should be .*" + mask_type):
            check_set_window_size(mask_type, window)
        return
    expected, warns = answer
    with pytest.warns(UserWarning, match="window_size") if warns else no_warnings():
        assert check_set_window_size(mask_type, window) == expected


@pytest.mark.parametrize("mask_type", OTHER_TYPES)
def test_causal_window_with_a_non_causal_mask_attends_everywhere(mask_type):
    """window_size=(-1, 0) with no_mask / padding / arbitrary is full attention with a warning, in
    the constructor and in the forward, as in TE (it was causal attention here)."""
    q, k, v, mask, keep = dense_case(mask_type, 7, 7, gqa=True)
    full = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type=mask_type)
    with pytest.warns(UserWarning, match="window_size"):
        windowed = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type=mask_type,
                                          window_size=(-1, 0))
    assert windowed.window_size == (-1, -1)
    expected = attention(*(t.transpose(1, 2) for t in (q, k, v)), keep=keep)
    assert_close(full(q, k, v, attention_mask=mask).view(B, 7, H, D).transpose(1, 2), expected.float())
    assert torch.equal(windowed(q, k, v, attention_mask=mask), full(q, k, v, attention_mask=mask))
    with pytest.warns(UserWarning, match="window_size"):
        called = full(q, k, v, attention_mask=mask, window_size=(-1, 0))
    assert torch.equal(called, full(q, k, v, attention_mask=mask))


def test_causal_window_in_multihead_attention_and_transformer_layer():
    """The same rule through te.MultiheadAttention and te.TransformerLayer, constructor and
    forward: (-1, 0) with 'no_mask' is the output of (-1, -1)."""
    torch.manual_seed(0)
    x = torch.randn(6, 2, 32)
    for make in (lambda **kw: te.MultiheadAttention(32, 4, attention_dropout=0.0, **kw),
                 lambda **kw: te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0,
                                                  **{"self_attn_mask_type" if k == "attn_mask_type" else k: v
                                                     for k, v in kw.items()})):
        torch.manual_seed(1)
        full = make(attn_mask_type="no_mask")
        torch.manual_seed(1)
        windowed = make(attn_mask_type="no_mask", window_size=(-1, 0))
        expected = full(x)
        with pytest.warns(UserWarning, match="window_size"):
            assert torch.equal(windowed(x), expected)
        with pytest.warns(UserWarning, match="window_size"):
            assert torch.equal(full(x, window_size=(-1, 0)), expected)
        torch.manual_seed(1)
        causal = make(attn_mask_type="causal")
        assert not torch.allclose(causal(x), expected)


@pytest.mark.parametrize("spelling", ["padding,causal", "causal,padding", "causal_padding", "padding_causal"])
def test_mask_spellings(spelling):
    q, k, v, mask, _ = dense_case("padding_causal", 7, 7, gqa=True)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type=spelling)
    assert m.attn_mask_type == "padding_causal"
    plain = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal")
    assert torch.equal(m(q, k, v, attention_mask=mask), plain(q, k, v, attention_mask=mask))
    assert torch.equal(plain(q, k, v, attention_mask=mask, attn_mask_type=spelling), plain(q, k, v, attention_mask=mask))


# --- bottom_right_diagonal -----------------------------------------------------------------------

@pytest.mark.parametrize("mask_type", ["no_mask", "padding", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("bottom_right_diagonal", [None, True, False], ids=str)
@pytest.mark.parametrize("where", ["constructor", "forward"])
def test_bottom_right_diagonal_moves_the_window(attention_backend, mask_type, bottom_right_diagonal, where):
    """The window of the non-causal types sits bottom-right unless bottom_right_diagonal=False;
    the causal types keep their own alignment whatever it says (TE's rule)."""
    sq, skv, window = 5, 9, (1, 2) if "causal" not in mask_type else (2, 0)
    q, k, v, mask, _ = dense_case(mask_type, sq, skv, gqa=True)
    lens_q, lens_kv = ([sq, sq - 3], [skv - 2, skv]) if "padding" in mask_type else ([sq] * B, [skv] * B)
    keep = torch.stack([keep_matrix(mask_type, sq, skv, lq, lkv, window, bottom_right_diagonal)
                        for lq, lkv in zip(lens_q, lens_kv)]).unsqueeze(1)
    placed = {"module_kwargs": {"window_size": window, "bottom_right_diagonal": bottom_right_diagonal}}
    if where == "forward":
        placed = {"forward_kwargs": {"window_size": window, "bottom_right_diagonal": bottom_right_diagonal}}
    _, results = run_dense("bshd", mask_type, sq, skv, True, torch.float32, inputs=(q, k, v, mask, keep),
                           keep=keep, **placed)
    check(results, torch.float32)


def test_bottom_right_diagonal_moves_alibi():
    """ALiBi's distances follow the same diagonal: top-left when bottom_right_diagonal=False."""
    sq, skv = 4, 7
    q, k, v, _, _ = dense_case("no_mask", sq, skv, gqa=True)
    slopes = masks.default_alibi_slopes(H)
    offsets = {True: skv - sq, False: 0}
    for flag, offset in offsets.items():
        distance = (torch.arange(sq).view(sq, 1) + offset - torch.arange(skv)).abs().double()
        bias = -slopes.double().view(1, H, 1, 1) * distance
        _, results = run_dense("bshd", "no_mask", sq, skv, True, torch.float32, inputs=(q, k, v, None, None),
                               bias=bias, module_kwargs={"bottom_right_diagonal": flag},
                               forward_kwargs={"core_attention_bias_type": "alibi"})
        check(results, torch.float32)


# --- attention sinks (softmax_type) --------------------------------------------------------------

@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
@pytest.mark.parametrize("mask_type", ["no_mask", "padding_causal", "arbitrary"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_type_sinks(softmax_type, mask_type, dtype):
    """P = exp(S) / (exp(offset[h]) + sum exp(S)): outputs and every gradient, the learnable
    offset's included, against the float64 reference; fully masked rows give zeros."""
    sq = skv = 7
    q, k, v, mask, keep = dense_case(mask_type, sq, skv, gqa=True)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type=mask_type,
                               softmax_type=softmax_type)
    if softmax_type == "learnable":
        assert m.softmax_offset.shape == (H,) and m.softmax_offset.dtype == torch.float32
        with torch.no_grad():
            m.softmax_offset.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    sink = m.softmax_offset.detach() if softmax_type == "learnable" else torch.zeros(H)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = m(*leaves, attention_mask=mask)
    dy = torch.randn_like(out)
    out.backward(dy)
    assert m.last_backend == "flash"  # the sink is the kernel's own

    ref_sink = sink.double().requires_grad_()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = attention(*(t.transpose(1, 2) for t in ref_leaves), keep=keep, sink=ref_sink)  # [b, h, s, d]
    ref = ref.transpose(1, 2).reshape(B, sq, H * D)
    ref.backward(dy.double())
    tolerance = {"dtype": dtype} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    assert_close(out, ref.to(dtype), name="output", **tolerance)
    for name, got, want in zip(("grad_q", "grad_k", "grad_v"), leaves, ref_leaves):
        assert_close(got.grad, want.grad.to(dtype), name=name, **tolerance)
    if softmax_type == "learnable":
        assert_close(m.softmax_offset.grad, ref_sink.grad.float(), name="grad_softmax_offset",
                     **({"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 3e-2, "atol": 3e-2}))
    if mask_type == "arbitrary":  # dense_case masks every key of query 1 in batch 0
        assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))


def test_off_by_one_sink_equals_an_extra_zero_key():
    """The zero sink is a key whose logit is 0 and whose value is 0: appending one to plain
    attention gives the same output."""
    q, k, v, _, _ = dense_case("no_mask", 6, 6, gqa=False)
    sink = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask", softmax_type="off-by-one")
    plain = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=D ** -0.5)
    zero = torch.zeros(B, 1, H, D)
    assert_close(sink(q, k, v), plain(q, torch.cat([k, zero], 1), torch.cat([v, zero], 1)))


@pytest.mark.parametrize("attention_backend", ["flash", "unfused"])
def test_sink_offsets_are_tes_attributes_with_gradients_in_a_cast_module(attention_backend):
    """TE's softmax_offset for every softmax_type: None for 'vanilla'; for 'off-by-one' plain
    zeros outside the state dict whose gradient a caller may ask for; for 'learnable' a
    parameter. A module cast to bf16 (.to(bf16), as TE's tests do) still runs both sinks, the
    gradient reaching the bf16 offset; equal on the flash and unfused backends."""
    assert te.DotProductAttention(H, D, qkv_format="bshd").softmax_offset is None
    q, k, v, _, _ = dense_case("no_mask", 6, 6, gqa=False)
    grads = {}
    for softmax_type in ("off-by-one", "learnable"):
        m = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask",
                                   softmax_type=softmax_type).to(torch.bfloat16)
        if softmax_type == "off-by-one":
            assert not isinstance(m.softmax_offset, torch.nn.Parameter) and "softmax_offset" not in m.state_dict()
            m.softmax_offset.requires_grad = True
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(selection, "PREFERENCE", tuple(b for b in selection.PREFERENCE if b.name == attention_backend))
            m(q.bfloat16(), k.bfloat16(), v.bfloat16()).float().square().sum().backward()
        assert m.last_backend == attention_backend and m.softmax_offset.grad is not None
        grads[softmax_type] = m.softmax_offset.grad.float()
    # Both offsets are 0 to start: the same sink, the same gradient.
    assert_close(grads["learnable"], grads["off-by-one"], rtol=2e-2, atol=2e-2, name="grad_softmax_offset")
    assert grads["learnable"].abs().sum() > 0


def test_learnable_sink_through_the_layers_and_checkpoints():
    """softmax_type reaches the core attention of MultiheadAttention and TransformerLayer; the
    learnable offset is a parameter with TE's state_dict key, trained like the others."""
    mha = te.MultiheadAttention(32, 4, softmax_type="learnable", attention_dropout=0.0)
    assert "core_attention.softmax_offset" in mha.state_dict()
    layer = te.TransformerLayer(32, 64, 4, softmax_type="learnable", hidden_dropout=0.0, attention_dropout=0.0)
    key = "self_attention.core_attention.softmax_offset"
    assert key in layer.state_dict()
    layer(torch.randn(5, 2, 32)).sum().backward()
    assert layer.get_parameter(key).grad is not None and layer.get_parameter(key).grad.abs().sum() > 0
    copy = te.TransformerLayer(32, 64, 4, softmax_type="learnable", hidden_dropout=0.0, attention_dropout=0.0)
    copy.load_state_dict(layer.state_dict())
    x = torch.randn(5, 2, 32)
    assert torch.equal(copy(x), layer(x))


def test_sink_refused_by_sdpa_alone():
    m = te.DotProductAttention(H, D, qkv_format="bshd", softmax_type="off-by-one")
    q = torch.randn(B, 5, H, D)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selection, "PREFERENCE", (BACKENDS["sdpa"],))
        with pytest.raises(RuntimeError, match="sdpa: torch SDPA has no attention sink"):
            m(q, q, q)


def test_bad_softmax_type():
    assert_value_error_naming(lambda: te.DotProductAttention(H, D, softmax_type="sink"), ["softmax_type", "sink"])


# --- return_max_logit ----------------------------------------------------------------------------

def reference_max_logit(q, k, keep, bias=None):
    """fp32 [h]: max over (b, sq, skv) of the kept scaled (+ biased) logits, -inf where none is."""
    h, g = q.shape[1], k.shape[1]
    scores = q.double() @ k.double().repeat_interleave(h // g, dim=1).transpose(-1, -2) * D ** -0.5
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~keep, float("-inf"))
    return scores.amax(dim=(0, 2, 3)).float()


@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding_causal", "arbitrary"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_return_max_logit(attention_backend, mask_type, fmt):
    q, k, v, mask, keep = dense_case(mask_type, 7, 7, gqa=True)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format=fmt, attn_mask_type=mask_type,
                               return_max_logit=True)
    plain = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format=fmt, attn_mask_type=mask_type)
    layers = [t.transpose(0, 1).contiguous() if fmt == "sbhd" else t for t in (q, k, v)]
    out, max_logit = m(*layers, attention_mask=mask)
    assert torch.equal(out, plain(*layers, attention_mask=mask))
    assert max_logit.shape == (H,) and max_logit.dtype == torch.float32 and not max_logit.requires_grad
    assert_close(max_logit, reference_max_logit(q.transpose(1, 2), k.transpose(1, 2), keep.expand(B, H, 7, 7)))


def test_return_max_logit_with_bias_thd_and_kv_heads():
    """The post-scale bias counts; packed sequences count their own tokens only."""
    q, k, v, _, keep = dense_case("causal", 6, 6, gqa=True)
    bias = torch.randn(1, H, 6, 6)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", return_max_logit=True)
    _, max_logit = m(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    assert_close(max_logit, reference_max_logit(q.transpose(1, 2), k.transpose(1, 2), keep.expand(B, H, 6, 6), bias))

    thd = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding",
                                 return_max_logit=True)
    lengths = [3, 6]
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    packed = [torch.cat([t[0, :3], t[1, :6]]) for t in (q, k, v)]
    _, max_logit = thd(*packed, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    keep_thd = torch.zeros(B, H, 6, 6, dtype=torch.bool)
    for b, n in enumerate(lengths):
        keep_thd[b, :, :n, :n] = True
    assert_close(max_logit, reference_max_logit(q.transpose(1, 2), k.transpose(1, 2), keep_thd))


def test_return_max_logit_with_zero_queries():
    m = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask", return_max_logit=True)
    empty = torch.randn(B, 0, H, D)
    out, max_logit = m(empty, torch.randn(B, 3, H, D), torch.randn(B, 3, H, D))
    assert out.shape == (B, 0, H * D) and torch.equal(max_logit, torch.full((H,), float("-inf")))


# --- forward keywords: pad_between_seqs, fp8_output, num_splits, score_mod ------------------------

def packed_with_gaps():
    """thd inputs [t, h, d] of two sequences (3 and 4 tokens) with a gap of 2 after each."""
    torch.manual_seed(3)
    compact = [torch.randn(7, H, D) for _ in range(3)]
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_padded = torch.tensor([0, 5, 11], dtype=torch.int32)
    gapped = []
    for t in compact:
        g = torch.zeros(11, H, D)
        g[0:3], g[5:9] = t[0:3], t[3:7]
        gapped.append(g)
    return compact, gapped, cu, cu_padded


def test_pad_between_seqs():
    compact, gapped, cu, cu_padded = packed_with_gaps()
    m = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    want = m(*compact, cu_seqlens_q=cu, cu_seqlens_kv=cu)  # [7, h * d]
    for flag in (None, True):
        got = m(*gapped, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                cu_seqlens_kv_padded=cu_padded, pad_between_seqs=flag)
        assert torch.equal(torch.cat([got[0:3], got[5:9]]), want)
        assert torch.equal(got[3:5], torch.zeros(2, H * D)) and torch.equal(got[9:], torch.zeros(2, H * D))
    # TE's hint without the padded offsets (TE's unfused path is called so in its tests): the
    # sequences start at cu_seqlens, packed without gaps.
    assert torch.equal(m(*compact, cu_seqlens_q=cu, cu_seqlens_kv=cu, pad_between_seqs=True), want)


def test_pad_between_seqs_through_the_layers_rotates_by_padded_positions():
    """MultiheadAttention / TransformerLayer take cu_seqlens_*_padded and pad_between_seqs; with
    it RoPE counts positions from the padded offsets (TE's rule): the gapped batch's real
    tokens equal the compact batch's."""
    torch.manual_seed(4)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_padded = torch.tensor([0, 5, 11], dtype=torch.int32)
    x = torch.randn(7, 32)
    gapped = torch.zeros(11, 32)
    gapped[0:3], gapped[5:9] = x[0:3], x[3:7]
    freqs = te.RotaryPositionEmbedding(8)(16)
    layer = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0, attn_input_format="thd",
                                self_attn_mask_type="padding_causal")
    want = layer(x, cu_seqlens_q=cu, cu_seqlens_kv=cu, rotary_pos_emb=freqs)
    got = layer(gapped, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                cu_seqlens_kv_padded=cu_padded, pad_between_seqs=True, rotary_pos_emb=freqs, fast_zero_fill=True)
    assert_close(torch.cat([got[0:3], got[5:9]]), want)


def test_packed_decoder_layer_takes_q_lengths_for_self_and_kv_lengths_for_cross_attention():
    """A thd decoder layer whose encoder output has other lengths than its input (as TE's
    test_transformer_layer gives them): self attention reads cu_seqlens_q on both sides, cross
    attention cu_seqlens_q against cu_seqlens_kv; each sequence equals its own run alone."""
    torch.manual_seed(5)
    lens_q, lens_kv = [3, 5], [6, 2]
    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32)
    cu_kv = torch.tensor([0, 6, 8], dtype=torch.int32)
    x, enc = torch.randn(8, 32), torch.randn(8, 32)
    layer = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0, attn_input_format="thd",
                                layer_type="decoder", self_attn_mask_type="padding_causal")
    got = layer(x, encoder_output=enc, enc_dec_attn_mask_type="padding", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                max_seqlen_q=5, max_seqlen_kv=6)
    for i in range(2):
        one_q = torch.tensor([0, lens_q[i]], dtype=torch.int32)
        one_kv = torch.tensor([0, lens_kv[i]], dtype=torch.int32)
        alone = layer(x[cu_q[i]:cu_q[i + 1]], encoder_output=enc[cu_kv[i]:cu_kv[i + 1]], enc_dec_attn_mask_type="padding",
                      cu_seqlens_q=one_q, cu_seqlens_kv=one_kv)
        assert_close(got[cu_q[i]:cu_q[i + 1]], alone, name=f"sequence {i}")


def test_rope_over_padded_formats_ignores_the_lengths_te_callers_pass():
    """TE's callers pass cu_seqlens for sbhd / bshd too (TE's test_te_layer_misc); RoPE counts
    positions by row there, as without them."""
    torch.manual_seed(6)
    freqs = te.RotaryPositionEmbedding(8)(16)
    layer = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal")
    x = torch.randn(6, 2, 32)
    cu = torch.tensor([0, 6, 12], dtype=torch.int32)
    assert_close(layer(x, rotary_pos_emb=freqs, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=6, max_seqlen_kv=6),
                 layer(x, rotary_pos_emb=freqs))


def test_backend_hints_are_accepted_and_callbacks_refused():
    q, k, v, _, _ = dense_case("causal", 6, 6, gqa=False)
    m = te.DotProductAttention(H, D, qkv_format="bshd")
    want = m(q, k, v)
    assert torch.equal(m(q, k, v, fp8_output=True, num_splits=4), want)  # no FP8 attention: high precision, as TE
    assert_value_error_naming(lambda: m(q, k, v, num_splits=0), ["num_splits", "0"])
    with pytest.raises(NotImplementedError, match="score_mod.*cuDNN"):
        m(q, k, v, score_mod=lambda graph, score, tensors: score)
    with pytest.raises(NotImplementedError, match="score_mod_tensors"):
        m(q, k, v, score_mod_tensors={"x": q})


def test_multihead_attention_kv_channels_pair_is_a_clear_error():
    assert_value_error_naming(lambda: te.MultiheadAttention(64, 4, kv_channels=(16, 8)),
                              ["kv_channels", "(16, 8)", "DotProductAttention"])


# --- FP8 attention flags ---------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["fp8_dpa", "fp8_mha"])
def test_fp8_attention_flags_of_a_block_recipe_warn_once(flag):
    """fp8_dpa / fp8_mha under a recipe FP8 attention does not take (a block-scaled one) run in
    high precision: one warning per process naming why, and the output is the high-precision one.
    (The per-tensor recipes run FP8 attention: tests/modules/test_dpa_fp8.py.)"""
    call_options._warn_fp8_attention.cache_clear()
    q, k, v, _, _ = dense_case("causal", 6, 6, gqa=False)
    m = te.DotProductAttention(H, D, qkv_format="bshd")
    want = m(q, k, v)
    fp8_recipe = recipe.MXFP8BlockScaling(**{flag: True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with te.autocast(recipe=fp8_recipe):
            first = m(q, k, v)
            second = m(q, k, v)
    said = [w for w in caught if "MXFP8BlockScaling" in str(w.message)]
    assert len(said) == 1 and "high precision" in str(said[0].message)
    assert torch.equal(first, want) and torch.equal(second, want)
    with no_warnings(), te.autocast(recipe=recipe.DelayedScaling()):
        assert torch.equal(m(q, k, v), want)  # without the flags: high precision, nothing to say


# --- get_attention_backend -------------------------------------------------------------------------

def test_get_attention_backend_answers_from_the_selection(caplog):
    def unfused(**fields):
        return get_attention_backend(AttentionParams(**fields))[4]

    assert get_attention_backend(AttentionParams()) == (False, None, False, None, True, [False, False, True])
    assert unfused(softmax_type="learnable", return_max_logit=True)
    assert unfused(attn_mask_type="padding_causal", window_size=(4, 0), qkv_layout="thd_thd_thd")
    with caplog.at_level(logging.WARNING, logger="DotProductAttention"):
        assert unfused(fp8=True, fp8_meta={"recipe": recipe.DelayedScaling(fp8_dpa=True)})  # FP8 attention runs
        assert not unfused(fp8=True, fp8_meta={"recipe": recipe.MXFP8BlockScaling(fp8_dpa=True)})
        assert "FP8 attention takes the per-tensor recipes" in caplog.text
        assert unfused(fp8=True, fp8_meta={"recipe": recipe.DelayedScaling()})
        assert not unfused(has_score_mod=True)
        assert not unfused(qkv_dtype=torch.int8)
        assert "sdpa:" in caplog.text and "unfused:" in caplog.text
        assert not unfused(context_parallel=True, softmax_type="off-by-one")
        assert not unfused(qkv_layout="thd_thd_thd", attn_mask_type="arbitrary")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selection, "PREFERENCE", (BACKENDS["sdpa"],))
        assert not unfused(softmax_type="off-by-one")
        assert unfused(softmax_type="vanilla")


def test_flash_attention_utils_says_no_flash_attn_package_is_installed():
    """TE's tests and callers read FlashAttentionUtils' version flags; flash-attn (a CUDA package)
    is never used here, so every version is absent and the versions compare as 0."""
    flags = ["is_installed", "v2_plus", "v2_1_plus", "v2_3_plus", "v2_4_plus", "v2_4_1_plus", "v2_5_plus",
             "v2_5_7_plus", "v2_6_0_plus", "v2_7_0_plus", "v3_is_installed", "use_v3", "v4_is_installed", "use_v4"]
    assert all(getattr(FlashAttentionUtils, name) is False for name in flags)
    for version in (FlashAttentionUtils.version, FlashAttentionUtils.fa3_version, FlashAttentionUtils.fa4_version):
        assert version < "2.1.1" and version == "0"


def test_sinks_and_max_logit_compile_fullgraph():
    """A learnable sink with max logits traces whole under torch.compile and matches eager,
    the offset's gradient included."""
    torch._dynamo.reset()
    q, k, v, mask, _ = dense_case("padding_causal", 7, 7, gqa=True)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                               softmax_type="learnable", return_max_logit=True)
    with torch.no_grad():
        m.softmax_offset.copy_(torch.linspace(-1, 1, H))
    results = []
    for module in (m, torch.compile(m, fullgraph=True)):
        m.softmax_offset.grad = None
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, max_logit = module(*leaves, attention_mask=mask)
        out.backward(torch.ones_like(out))
        results.append([out, max_logit, m.softmax_offset.grad] + [t.grad for t in leaves])
    for name, eager, compiled in zip(("output", "max_logit", "grad_offset", "grad_q", "grad_k", "grad_v"), *results):
        assert_close(compiled, eager, name=name)


def test_layers_resolve_the_window_for_the_calls_mask_type_quietly():
    """As TE's MultiheadAttention and TransformerLayer: a module built causal and called with
    'padding' resolves its unset window for 'padding', (-1, -1), without a warning."""
    x = torch.randn(5, 2, 32)
    pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    pad[1, ..., 3:] = True
    torch.manual_seed(2)
    mha = te.MultiheadAttention(32, 4, attention_dropout=0.0)
    layer = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0)
    with no_warnings():
        mha(x, attention_mask=pad, attn_mask_type="padding")
        layer(x, attention_mask=pad, self_attn_mask_type="padding")
