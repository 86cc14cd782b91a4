"""Incremental decoding with te.InferenceParams (TE's KV cache) through DotProductAttention and
TransformerLayer, in the bshd, sbhd and thd formats: each step's outputs equal those of the
whole sequences run at once with a causal mask, while sequences join, finish, change places in
the batch and take several new tokens in one step. RoPE positions continue from the cache."""
from collections import OrderedDict

import pytest
import torch

import transformer_engine.pytorch as te
from numerics import assert_close

HEADS, GROUPS, HEAD_DIM = 4, 2, 8
# Each step: {sequence: new tokens}, in batch order. Sequence 2 joins at step 1, sequence 0
# finishes after step 1 (sequence 1 then moves to row 0), and the order changes at step 3.
STEPS = [OrderedDict({0: 5, 1: 3}), OrderedDict({0: 1, 1: 1, 2: 4}), OrderedDict({1: 1, 2: 1}),
         OrderedDict({2: 2, 1: 1})]
TOTALS = {0: 6, 1: 6, 2: 7}
MAX_NEW = max(n for step in STEPS for n in step.values())


def step_input(whole, step, done, fmt):
    """The new tokens of each sequence of the step, from whole[seq] [L, ...], in fmt:
    bshd [b, MAX_NEW, ...] (zero padding), sbhd [MAX_NEW, b, ...] or thd [tokens, ...]."""
    pieces = [whole[seq][done[seq]:done[seq] + new] for seq, new in step.items()]
    if fmt == "thd":
        return torch.cat(pieces)
    padded = torch.zeros(len(pieces), MAX_NEW, *pieces[0].shape[1:])
    for i, piece in enumerate(pieces):
        padded[i, :len(piece)] = piece
    return padded if fmt == "bshd" else padded.transpose(0, 1).contiguous()


def new_outputs(out, step, fmt):
    """Per sequence of the step, the outputs of its new tokens [new, ...]."""
    if fmt == "thd":
        return dict(zip(step, out.split(list(step.values()))))
    by_batch = out if fmt == "bshd" else out.transpose(0, 1)
    return {seq: by_batch[i, :new] for i, (seq, new) in enumerate(step.items())}


def decode(module, inputs, fmt, **kwargs):
    """Runs STEPS through module with a KV cache; returns {seq: outputs of all its tokens}."""
    params = te.InferenceParams(max_batch_size=3, max_sequence_length=8, num_heads_kv=GROUPS, head_dim_k=HEAD_DIM,
                                dtype=torch.float32, max_ctx_len=MAX_NEW, qkv_format=fmt)
    done, outputs = {seq: 0 for seq in TOTALS}, {seq: [] for seq in TOTALS}
    for step in STEPS:
        params.pre_step(step)
        out = module(*(step_input(whole, step, done, fmt) for whole in inputs), inference_params=params, **kwargs)
        for seq, rows in new_outputs(out, step, fmt).items():
            outputs[seq].append(rows)
            done[seq] += step[seq]
    return {seq: torch.cat(rows) for seq, rows in outputs.items()}


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dot_product_attention_decodes_as_the_whole_sequence_attends(fmt):
    torch.manual_seed(0)
    q = {seq: torch.randn(n, HEADS, HEAD_DIM) for seq, n in TOTALS.items()}
    k = {seq: torch.randn(n, GROUPS, HEAD_DIM) for seq, n in TOTALS.items()}
    v = {seq: torch.randn(n, GROUPS, HEAD_DIM) for seq, n in TOTALS.items()}
    attention = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="padding_causal",
                                       qkv_format=fmt, layer_number=1)
    got = decode(attention, (q, k, v), fmt)
    whole = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="causal", qkv_format="bshd")
    for seq in TOTALS:
        want = whole(q[seq][None], k[seq][None], v[seq][None])[0]  # [L, h * d]
        assert_close(got[seq], want, name=f"sequence {seq}")


@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_transformer_layer_decodes_with_rope_as_the_whole_sequence(fmt):
    torch.manual_seed(1)
    hidden = HEADS * HEAD_DIM
    kwargs = dict(hidden_size=hidden, ffn_hidden_size=64, num_attention_heads=HEADS, num_gqa_groups=GROUPS,
                  hidden_dropout=0.0, attention_dropout=0.0, layer_number=1)
    layer = te.TransformerLayer(**kwargs, self_attn_mask_type="padding_causal", attn_input_format=fmt)
    reference = te.TransformerLayer(**kwargs, self_attn_mask_type="causal", attn_input_format="bshd")
    reference.load_state_dict(layer.state_dict())
    freqs = te.RotaryPositionEmbedding(HEAD_DIM)(8)
    x = {seq: torch.randn(n, hidden) for seq, n in TOTALS.items()}
    with torch.no_grad():
        got = decode(layer, (x,), fmt, rotary_pos_emb=freqs)
        for seq in TOTALS:
            want = reference(x[seq][None], rotary_pos_emb=freqs)[0]
            assert_close(got[seq], want, name=f"sequence {seq}")


def test_kv_cache_refusals_name_the_problem():
    params = te.InferenceParams(2, 8, GROUPS, HEAD_DIM, torch.float32)
    params.pre_step(OrderedDict({0: 2}))
    q, kv = torch.randn(1, 2, HEADS, HEAD_DIM), torch.randn(1, 2, GROUPS, HEAD_DIM)
    causal = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="causal", layer_number=1,
                                    qkv_format="bshd")
    with pytest.raises(ValueError, match="padding mask type"):
        causal(q, kv, kv, inference_params=params)
    unnumbered = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="padding_causal",
                                        qkv_format="bshd")
    with pytest.raises(ValueError, match="layer_number"):
        unnumbered(q, kv, kv, inference_params=params)
    with pytest.raises(ValueError, match="dtype"):
        causal(q.double(), kv.double(), kv.double(), attn_mask_type="padding_causal", inference_params=params)
