"""TE's MoE token permutation (transformer_engine.pytorch.permutation): against a loop over the
routed copies for 'mask' and 'index' maps, with dropped rows; unpermute undoing permute with
merging probabilities; gradients (gradcheck); chunk sorting; and Megatron-Core's fused path
(which calls these) against its own unfused one."""
import pytest
import torch

import transformer_engine.pytorch as te


def routing(tokens=9, experts=4, top_k=2, seed=0):
    """(mask [tokens, experts] int32, index [tokens, top_k], probs [tokens, experts])."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=generator)
    index = scores.topk(top_k, dim=-1).indices
    mask = torch.zeros(tokens, experts, dtype=torch.int32).scatter_(1, index, 1)
    return mask, index, torch.softmax(scores, dim=-1)


def loop_permute(x, mask):
    """The copies grouped by expert, each expert's in token order: (rows, (token, expert) of each)."""
    pairs = [(t, e) for e in range(mask.shape[1]) for t in range(mask.shape[0]) if mask[t, e]]
    return torch.stack([x[t] for t, _ in pairs]) if pairs else x[:0], pairs


@pytest.mark.parametrize("num_out_tokens", [-1, 11], ids=["all", "drop"])
def test_mask_map_matches_a_loop(num_out_tokens):
    x = torch.randn(9, 6)
    mask, _, probs = routing()
    want, pairs = loop_permute(x, mask)
    kept = len(pairs) if num_out_tokens < 0 else num_out_tokens
    out, permuted_probs, row_id_map = te.moe_permute_with_probs(x, probs, mask, num_out_tokens)
    assert torch.equal(out, want[:kept])
    assert torch.equal(permuted_probs, torch.stack([probs[t, e] for t, e in pairs[:kept]]))
    back = te.moe_unpermute(out, row_id_map, merging_probs=probs, restore_shape=x.shape)
    expected = torch.zeros_like(x)
    for (t, e), row in zip(pairs[:kept], out):
        expected[t] += probs[t, e] * row
    torch.testing.assert_close(back, expected)


@pytest.mark.parametrize("align_size", [1, 4, 16])
def test_permute_and_pad_puts_each_experts_rows_at_aligned_starts(align_size):
    """Expert e's rows start at the sum of the padded counts before it and are followed by zero
    rows (probability 0) up to a multiple of align_size; unpermute with pad_offsets undoes it."""
    x = torch.randn(9, 6)
    mask, _, probs = routing()
    counts = mask.sum(0)
    padded, padded_probs, row_id_map, pad_offsets, padded_counts = te.moe_permute_and_pad_with_probs(
        x, probs, mask, counts, align_size)
    want, pairs = loop_permute(x, mask)
    assert padded_counts.tolist() == [-(-int(c) // align_size) * align_size for c in counts]
    assert padded.shape == (int(padded_counts.sum()), 6)
    start, row = 0, 0
    for expert, (count, padded_count) in enumerate(zip(counts.tolist(), padded_counts.tolist())):
        assert torch.equal(padded[start:start + count], want[row:row + count])
        assert torch.equal(padded[start + count:start + padded_count], torch.zeros(padded_count - count, 6))
        assert torch.equal(padded_probs[start:start + count], torch.stack([probs[t, e] for t, e in
                                                                            pairs[row:row + count]]))
        assert not padded_probs[start + count:start + padded_count].any()
        start, row = start + padded_count, row + count
    assert (pad_offsets is None) == (align_size == 1)
    back = te.moe_unpermute(padded, row_id_map, merging_probs=probs, restore_shape=x.shape, pad_offsets=pad_offsets)
    torch.testing.assert_close(back, x * (probs * mask).sum(-1, keepdim=True))


def test_permute_and_pad_gradients_and_refusals():
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    mask, _, probs = routing(tokens=7, experts=3)
    probs = probs.double().requires_grad_()

    def round_trip(x, probs):
        padded, padded_probs, row_id_map, pad_offsets, _ = te.moe_permute_and_pad_with_probs(x, probs, mask,
                                                                                             mask.sum(0), 4)
        return te.moe_unpermute(padded * 2.0, row_id_map, merging_probs=probs, pad_offsets=pad_offsets), padded_probs

    assert torch.autograd.gradcheck(round_trip, (x, probs))
    with pytest.raises(ValueError, match="column sums"):
        te.moe_permute_and_pad_with_probs(x, probs, mask, mask.sum(0) + 1, 4)
    with pytest.raises(ValueError, match="align_size"):
        te.moe_permute_and_pad_with_probs(x, probs, mask, mask.sum(0), 0)
    with pytest.raises(ValueError, match="mask"):
        te.moe_unpermute(x, torch.zeros(7, 2, dtype=torch.int64), map_type="index", pad_offsets=torch.zeros(3))


def test_index_map_orders_by_expert_then_token_and_k():
    x = torch.randn(9, 5)
    _, index, _ = routing(top_k=3)
    out, row_id_map = te.moe_permute(x, index, map_type="index")
    pairs = sorted(((int(index[t, k]), t, k) for t in range(9) for k in range(3)))
    assert torch.equal(out, torch.stack([x[t] for _, t, _ in pairs]))
    weights = torch.rand(9, 3)
    back = te.moe_unpermute(out, row_id_map, merging_probs=weights, map_type="index")
    torch.testing.assert_close(back, x * weights.sum(-1, keepdim=True))


def test_gradients_in_tokens_and_probabilities():
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    mask, _, probs = routing(tokens=7, experts=3)
    probs = probs.double().requires_grad_()

    def round_trip(x, probs):
        out, permuted_probs, row_id_map = te.moe_permute_with_probs(x, probs, mask)
        return te.moe_unpermute(out * 2.0, row_id_map, merging_probs=probs, restore_shape=x.shape), permuted_probs

    assert torch.autograd.gradcheck(round_trip, (x, probs))


def test_sort_chunks_by_index_and_back():
    x = torch.arange(10.0).unsqueeze(-1).repeat(1, 3)
    split_sizes, order = torch.tensor([3, 0, 4, 3]), torch.tensor([2, 0, 3, 1])
    out = te.moe_sort_chunks_by_index(x, split_sizes, order)
    assert out[:, 0].tolist() == [3, 4, 5, 6, 0, 1, 2, 7, 8, 9]
    back = te.moe_sort_chunks_by_index(out, split_sizes[order], torch.argsort(order))
    assert torch.equal(back, x)
    probs = torch.arange(10.0)
    _, sorted_probs = te.moe_sort_chunks_by_index_with_probs(x, probs, split_sizes, order)
    assert torch.equal(sorted_probs, out[:, 0])


def test_bad_map_type():
    with pytest.raises(ValueError, match="map_type"):
        te.moe_permute(torch.randn(2, 2), torch.ones(2, 2, dtype=torch.int32), map_type="dense")


def test_megatron_fused_permutation_equals_its_unfused_one():
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    x = torch.randn(12, 8, requires_grad=True)
    mask, _, probs = routing(tokens=12, experts=4)
    mask = mask.bool()
    outputs = {}
    for fused in (False, True):
        tokens = x.detach().clone().requires_grad_()
        permuted, permuted_probs, indices, *_ = moe_utils.permute(tokens, mask, probs=probs, fused=fused,
                                                                  num_out_tokens=int(mask.sum()))
        restored = moe_utils.unpermute(permuted * 3.0, indices, tokens.shape, probs=probs, routing_map=mask,
                                       fused=fused)
        restored.sum().backward()
        outputs[fused] = (permuted, permuted_probs, restored, tokens.grad)
    for name, unfused, fused in zip(("permuted", "permuted_probs", "restored", "grad"), outputs[False], outputs[True]):
        torch.testing.assert_close(fused, unfused, msg=name)


def test_permutations_compile():
    """The permutation functions are plain PyTorch: torch.compile(fullgraph=True) traces
    moe_permute and moe_unpermute whole; the padded form checks its counts on the host (a graph
    break, as TE's); both give the eager results."""
    x = torch.randn(9, 6)
    mask, index, probs = routing()
    counts = mask.sum(0)

    def round_trip(x, probs, mask):
        padded, _, row_id_map, pad_offsets, _ = te.moe_permute_and_pad_with_probs(x, probs, mask, counts, 4)
        return te.moe_unpermute(padded, row_id_map, merging_probs=probs, pad_offsets=pad_offsets)

    compiled = torch.compile(round_trip, backend="aot_eager")
    torch.testing.assert_close(compiled(x, probs, mask), round_trip(x, probs, mask))

    def permute_and_back(x, probs, mask):
        out, _, row_id_map = te.moe_permute_with_probs(x, probs, mask)
        return te.moe_unpermute(out, row_id_map, merging_probs=probs)

    compiled = torch.compile(permute_and_back, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, probs, mask), permute_and_back(x, probs, mask))
    permute = torch.compile(lambda x, i: te.moe_permute(x, i, map_type="index"), fullgraph=True, backend="aot_eager")
    assert torch.equal(permute(x, index)[0], te.moe_permute(x, index, map_type="index")[0])
