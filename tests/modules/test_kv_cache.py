"""Incremental decoding with te.InferenceParams (TE's KV cache) through DotProductAttention and
TransformerLayer, in the bshd, sbhd and thd formats: each step's outputs equal those of the
whole sequences run at once with a causal mask, while sequences join, finish, change places in
the batch and take several new tokens in one step. RoPE positions continue from the cache."""
import logging
from collections import OrderedDict

import pytest
import torch

import transformer_engine.pytorch as te
from numerics import assert_close
from transformer_engine.pytorch.attention.inference import PagedKVCacheManager

HEADS, GROUPS, HEAD_DIM = 4, 2, 8
# Each step: {sequence: new tokens}, in batch order. Sequence 2 joins at step 1, sequence 0
# finishes after step 1 (sequence 1 then moves to row 0), and the order changes at step 3.
STEPS = [OrderedDict({0: 5, 1: 3}), OrderedDict({0: 1, 1: 1, 2: 4}), OrderedDict({1: 1, 2: 1}),
         OrderedDict({2: 2, 1: 1})]
TOTALS = {0: 6, 1: 6, 2: 7}
MAX_NEW = max(n for step in STEPS for n in step.values())


def step_input(whole, step, done, fmt, rows=None):
    """The new tokens of each sequence of the step, from whole[seq] [L, ...], in fmt:
    bshd [b, MAX_NEW, ...] (zero padding), sbhd [MAX_NEW, b, ...] or thd [tokens, ...]; with
    `rows`, b = rows, the rows past the step's sequences zero (a batch of fixed size)."""
    pieces = [whole[seq][done[seq]:done[seq] + new] for seq, new in step.items()]
    if fmt == "thd":
        return torch.cat(pieces)
    padded = torch.zeros(rows or len(pieces), MAX_NEW, *pieces[0].shape[1:])
    for i, piece in enumerate(pieces):
        padded[i, :len(piece)] = piece
    return padded if fmt == "bshd" else padded.transpose(0, 1).contiguous()


def new_outputs(out, step, fmt):
    """Per sequence of the step, the outputs of its new tokens [new, ...]."""
    if fmt == "thd":
        return dict(zip(step, out.split(list(step.values()))))
    by_batch = out if fmt == "bshd" else out.transpose(0, 1)
    return {seq: by_batch[i, :new] for i, (seq, new) in enumerate(step.items())}


def decode(module, inputs, fmt, paged=False, fixed_batch=False, **kwargs):
    """Runs STEPS through module with a KV cache; returns {seq: outputs of all its tokens}. With
    fixed_batch, every step's input has max_batch_size rows (TE's CUDA-graph steps), and the
    rows past the step's sequences must come out zero."""
    pages = dict(is_paged=True, page_size=2, total_num_pages=12) if paged else {}
    max_batch_size = 3
    params = te.InferenceParams(max_batch_size=max_batch_size, max_sequence_length=8, num_heads_kv=GROUPS,
                                head_dim_k=HEAD_DIM, dtype=torch.float32, max_ctx_len=MAX_NEW, qkv_format=fmt, **pages)
    batch_rows = max_batch_size if fixed_batch else None
    done, outputs = {seq: 0 for seq in TOTALS}, {seq: [] for seq in TOTALS}
    for step in STEPS:
        params.pre_step(step)
        out = module(*(step_input(whole, step, done, fmt, batch_rows) for whole in inputs), inference_params=params,
                     **kwargs)
        if fixed_batch:
            by_batch = out if fmt == "bshd" else out.transpose(0, 1)
            assert by_batch.shape[0] == max_batch_size and not by_batch[len(step):].any(), "padding rows"
        for seq, rows in new_outputs(out, step, fmt).items():
            outputs[seq].append(rows)
            done[seq] += step[seq]
    return {seq: torch.cat(rows) for seq, rows in outputs.items()}


def attention_case(fmt):
    """({seq: q [L, h, d]}, {seq: k}, {seq: v}, a DotProductAttention decoding in fmt)."""
    torch.manual_seed(0)
    q = {seq: torch.randn(n, HEADS, HEAD_DIM) for seq, n in TOTALS.items()}
    k = {seq: torch.randn(n, GROUPS, HEAD_DIM) for seq, n in TOTALS.items()}
    v = {seq: torch.randn(n, GROUPS, HEAD_DIM) for seq, n in TOTALS.items()}
    attention = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="padding_causal",
                                       qkv_format=fmt, layer_number=1)
    return q, k, v, attention


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dot_product_attention_decodes_as_the_whole_sequence_attends(fmt, paged):
    q, k, v, attention = attention_case(fmt)
    got = decode(attention, (q, k, v), fmt, paged)
    whole = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="causal", qkv_format="bshd")
    for seq in TOTALS:
        want = whole(q[seq][None], k[seq][None], v[seq][None])[0]  # [L, h * d]
        assert_close(got[seq], want, name=f"sequence {seq}")


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_transformer_layer_decodes_with_rope_as_the_whole_sequence(fmt, paged):
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
        got = decode(layer, (x,), fmt, paged, rotary_pos_emb=freqs)
        for seq in TOTALS:
            want = reference(x[seq][None], rotary_pos_emb=freqs)[0]
            assert_close(got[seq], want, name=f"sequence {seq}")


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_a_batch_kept_at_max_batch_size_decodes_the_same(fmt, paged):
    """TE's CUDA-graph steps keep the batch at max_batch_size: the step's sequences come out as
    in a batch of their own, the padding rows zero."""
    q, k, v, attention = attention_case(fmt)
    got = decode(attention, (q, k, v), fmt, paged, fixed_batch=True)
    want = decode(attention, (q, k, v), fmt, paged)
    for seq in TOTALS:
        assert torch.equal(got[seq], want[seq]), f"sequence {seq}"


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_the_cache_lengths_reach_the_flash_kernel_as_the_step_counts_them(monkeypatch, fmt, paged):
    """The flash kernel takes each step's lengths as InferenceParams counted them (one token
    each, several, sequences joining and leaving), none counted back from a padding mask, and
    decodes as the whole sequences attend."""
    from transformer_engine.pytorch.attention.backends import flash
    monkeypatch.setattr(flash, "_cumulative", lambda *args: pytest.fail("lengths counted back from a padding mask"))
    lengths = []
    attend = flash.flash_attention

    def recorded(*args, **kwargs):
        lengths.append((kwargs["cu_seqlens_q"].tolist(), kwargs["cu_seqlens_kv"].tolist()))
        return attend(*args, **kwargs)
    q, k, v, attention = attention_case(fmt)
    with monkeypatch.context() as patch:
        patch.setattr(flash, "flash_attention", recorded)
        got = decode(attention, (q, k, v), fmt, paged)
    assert lengths == [([0, 5, 8], [0, 5, 8]), ([0, 1, 2, 6], [0, 6, 10, 14]), ([0, 1, 2], [0, 5, 10]),
                       ([0, 2, 3], [0, 7, 13])]
    whole = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=GROUPS, attn_mask_type="causal", qkv_format="bshd")
    for seq in TOTALS:
        assert_close(got[seq], whole(q[seq][None], k[seq][None], v[seq][None])[0], name=f"sequence {seq}")


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


def test_paged_cache_gives_pages_back_and_refuses_when_full():
    """Pages are taken as sequences grow and given back when they leave; a step that needs more
    pages than are free is refused before anything changes; the page table and the gathered
    (non-paged) view agree with what was written."""
    params = te.InferenceParams(2, 4, 1, 2, torch.float32, is_paged=True, page_size=2, total_num_pages=4)
    params.pre_step(OrderedDict({7: 3}))  # two pages
    manager = params.cache_manager
    assert manager.pages[7] == [0, 1] and manager.free_pages == [2, 3]
    keys = torch.arange(6.).reshape(1, 3, 1, 2)
    k_pool, _, _, cu_kv, _, _ = params.step(1, keys, -keys, "bshd")
    assert k_pool.shape == (4, 2, 1, 2) and cu_kv.tolist() == [0, 3, 3]
    k_whole, v_whole = params.convert_paged_to_nonpaged(1)
    assert k_whole.shape == (1, 4, 1, 2)
    assert torch.equal(k_whole[0, :3], keys[0]) and torch.equal(v_whole[0, :3], -keys[0])
    params.pre_step(OrderedDict({8: 4, 7: 1}))  # 8 joins first in the batch: two pages; 7 fills its second
    assert manager.pages == {7: [0, 1], 8: [2, 3]} and manager.free_pages == []
    assert manager.page_table.tolist() == [[2, 3], [0, 1]]
    params.pre_step(OrderedDict({9: 1}))  # both leave: their pages serve 9
    assert manager.pages == {9: [2]} and sorted(manager.free_pages) == [0, 1, 3]
    # TE's sizes (total_num_pages = max_batch_size * pages per sequence) never run out; a pool
    # built smaller refuses the step that would overflow it, before anything changes.
    small = PagedKVCacheManager(total_num_pages=3, page_size=2, num_heads=1, head_dim_k=2, dtype=torch.float32,
                                max_batch_size=2, max_seqlen=4)
    small.pre_step(OrderedDict({1: 3}))
    with pytest.raises(RuntimeError, match="full: this step needs 2 more pages, 1 of 3 are free"):
        small.pre_step(OrderedDict({1: 1, 2: 3}))
    assert small.sequences == OrderedDict({1: 3}) and small.pages == {1: [0, 1]}


def test_paged_cache_reports_its_pages_at_debug_level(caplog):
    """TE's print_cache: the pages used and free, then each sequence's tokens and pages."""
    params = te.InferenceParams(2, 4, 1, 2, torch.float32, is_paged=True, page_size=2, total_num_pages=4)
    params.pre_step(OrderedDict({7: 3, 8: 1}))
    with caplog.at_level(logging.DEBUG, logger="PagedKVCacheManager"):
        params.cache_manager.print_cache()
    assert "4 pages (used 3, free 1), 2 sequences" in caplog.text
    assert "seq_id 7, 3 tokens, 2 pages [0, 1]" in caplog.text and "seq_id 8, 1 tokens, 1 pages [2]" in caplog.text
    for bad, words in ((dict(page_size=3, total_num_pages=4), "page_size"),
                       (dict(page_size=2, total_num_pages=5), "total_num_pages = max_batch_size")):
        with pytest.raises(ValueError, match=words):
            te.InferenceParams(2, 4, 1, 2, torch.float32, is_paged=True, **bad)
