"""Context parallelism in te.DotProductAttention on 2 gloo ranks over this machine's loopback:
every cp_comm_type at CP=2 against the same module on the whole sequence (CP=1), output and
dq/dk/dv, in each format and mask type (context_parallel_cases.py); te.TransformerLayer's
set_context_parallel_group with RoPE; the refusals that need a group of 2. All of it runs in
one pair of spawned processes. The argument checks that need no group run here."""
import pytest
import torch

import transformer_engine.pytorch as te
from gloo_ranks import run_on_ranks
import context_parallel_cases

CASES = {case.name: case for case in context_parallel_cases.cases()}


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(context_parallel_cases.run_all, world=2)


def _assert_close(checks, bound: float, where: str) -> None:
    for what, diff, scale in checks:
        # Relative to the largest expected value, with a floor for gradients that are zero in
        # exact arithmetic, which both sides compute as rounding noise.
        assert diff <= bound * max(scale, 1e-3), f"{where}: {what} differs by {diff:.3g} (max |expected| {scale:.3g})"


@pytest.mark.parametrize("name", sorted(CASES))
def test_cp2_equals_cp1(results, name):
    case = CASES[name]
    # fp32: summation order only. bf16: the output and gradients are rounded to bf16 on both
    # sides, and the ring computes in fp32 where CP=1 may not: a few bf16 ulps (2^-8 each).
    bound = 1e-5 if case.dtype == torch.float32 else 2e-2
    for rank, found in results.items():
        _assert_close(found[name]["checks"], bound, f"rank {rank}, {name}")
        # The ring runs its own blockwise attention; the gathered comm types, the package's backends.
        ring = case.comm in ("p2p", "a2a+p2p")
        assert (found[name]["backend"] == "cp_ring") == ring, found[name]["backend"]


@pytest.mark.parametrize("comm", context_parallel_cases.LAYER_COMMS)
def test_transformer_layer_with_rope(results, comm):
    for rank, found in results.items():
        _assert_close(found["layers"][comm], 1e-5, f"rank {rank}, TransformerLayer {comm}")


REFUSALS = {
    "dropout": ("NotImplementedError", ["cp_comm_type='p2p'", "attention_dropout", "0.1"]),
    "padding": ("NotImplementedError", ["attn_mask_type", "'padding'", "qkv_format='bshd'"]),
    "bias": ("NotImplementedError", ["core_attention_bias_type", "'post_scale_bias'"]),
    "odd_shard": ("ValueError", ["even", "got 7", "(2, 7, 4, 8)"]),
    "heads": ("ValueError", ["num_gqa_groups (1)", "2 ranks"]),
    "thd_slots": ("ValueError", ["multiple of 4", "cu_seqlens_q", "[6, 6]"]),
    "kv_cache": ("NotImplementedError", ["inference_params", "cp_group"]),
}


@pytest.mark.parametrize("what", sorted(REFUSALS))
def test_refusals_at_cp2(results, what):
    kind, words = REFUSALS[what]
    for found in results.values():
        message = found["refusals"][what]
        assert message.startswith(kind + ":") and all(word in message for word in words), message


def test_group_and_comm_type_arguments():
    with pytest.raises(ValueError, match=r"cp_comm_type must be one of .*'ring'"):
        te.DotProductAttention(4, 8, cp_comm_type="ring")
    with pytest.raises(ValueError, match="cp_group must be a torch.distributed ProcessGroup.*'all_gather'.*object"):
        te.DotProductAttention(4, 8, cp_group=object(), cp_comm_type="all_gather")
    with pytest.raises(ValueError, match=r"'a2a\+p2p' takes cp_group = \[a2a group, p2p group\]"):
        te.DotProductAttention(4, 8, cp_group=[object()], cp_comm_type="a2a+p2p")
    attention = te.DotProductAttention(4, 8)
    with pytest.raises(ValueError, match="cp_group must be a torch.distributed ProcessGroup.*list"):
        attention.set_context_parallel_group([object(), object()], None, None, "p2p")


def test_set_context_parallel_group_reaches_the_core_attention():
    layer = te.TransformerLayer(32, 64, 4, layer_type="decoder", hidden_dropout=0.0, attention_dropout=0.0)
    layer.set_context_parallel_group(None, [0], None, "a2a")  # no group: context parallelism off
    for mha in (layer.self_attention, layer.inter_attention):
        assert mha.core_attention.cp_comm_type == "a2a" and (mha.cp_size, mha.cp_rank) == (1, 0)
    with pytest.raises(ValueError, match="cp_comm_type"):
        layer.set_context_parallel_group(None, None, None, "p2p+a2a")
    x = torch.randn(8, 2, 32)
    assert layer(x, encoder_output=x).shape == (8, 2, 32)


# --- the p2p ring's block engines -----------------------------------------------------------------

def _block_reference(q, k, v, mask, scale):
    """float64 (out, lse) and the gradient function of one block, GQA by repetition."""
    ratio = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(ratio, 1) for t in (k, v))
    scores = q.double() @ k64.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num() @ v64, torch.logsumexp(scores, -1)


BLOCKS = {  # (rows, cols, causal, masked): the ring's kinds of block
    "whole": (12, 12, False, False),
    "own_causal": (12, 12, True, False),
    "by_position": (12, 20, False, True),
    "half_rows": (6, 12, False, False),
}


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_ring_block_engines_agree_with_the_float64_block(kind):
    """FlashBlocks (the CPU kernel, which the ring runs on the CPU) and MatmulBlocks (elsewhere):
    a block's out and lse, and its share of the gradients given the final out and lse of a
    softmax over this block and another, against float64."""
    from transformer_engine.pytorch.attention.ring_attention import (Block, FlashBlocks, MatmulBlocks, _merge,
                                                                     engine_for)
    rows, cols, causal, masked = BLOCKS[kind]
    torch.manual_seed(0)
    q = torch.randn(2, 4, rows, 8)
    (k, v), (k2, v2) = ((torch.randn(2, 2, cols, 8), torch.randn(2, 2, cols, 6)) for _ in range(2))
    mask = torch.rand(2, 1, rows, cols) < 0.3 if masked else None
    block, other = Block(slice(None), slice(None), mask, causal=causal), Block(slice(None), slice(None), None)
    assert engine_for(q, k, v) is FlashBlocks
    dense = block.dense_mask(rows, cols, q.device)
    want, want_lse = _block_reference(q, k, v, dense, 0.3)
    for engine in (FlashBlocks, MatmulBlocks):
        out, lse = engine.forward(q, k, v, block, 0.3)
        torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5)
        seen = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), seen)
        torch.testing.assert_close(lse[seen].double(), want_lse[seen], rtol=0, atol=1e-5)
        # The final softmax over both blocks, then this block's share of its gradients.
        other_out, other_lse = engine.forward(q, k2, v2, other, 0.3)
        total, total_lse = out.clone(), lse.clone()
        _merge(total, total_lse, other_out, other_lse)
        dout = torch.randn_like(total)
        grads = engine.backward(q, k, v, block, 0.3, dout, total, total_lse)
        leaves = [t.double().requires_grad_() for t in (q, k, v, k2, v2)]
        both_k, both_v = torch.cat(leaves[1:4:2], 2), torch.cat(leaves[2:5:2], 2)
        both_mask = None if dense is None else torch.cat((dense.expand(2, 1, rows, cols),
                                                          torch.zeros(2, 1, rows, cols, dtype=torch.bool)), -1)
        whole, _ = _block_reference(leaves[0], both_k, both_v, both_mask, 0.3)
        # D = rowsum(dout * out) from the out the engine was given, as the ring forms it.
        whole.backward(dout.double())
        for name, got, exact in zip(("dq", "dk", "dv"), grads, leaves[:3]):
            want_grad = exact.grad
            if name == "dq":  # the other block's share of dq is not this block's
                other_dq = engine.backward(q, k2, v2, other, 0.3, dout, total, total_lse)[0]
                got = got + other_dq
            torch.testing.assert_close(got.double(), want_grad, rtol=0, atol=2e-5, msg=f"{engine.name} {name}")
