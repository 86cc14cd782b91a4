"""RoPE under context parallelism (each rank holding chunks r and 2 cp - 1 - r of the sequence)
and apply_fused_qkv_rotary_pos_emb (query and key of a fused projection rotated, value passed
through): against RoPE of the whole sequence and of the split tensors, with gradients."""
import pytest
import torch

from numerics import assert_close
from transformer_engine.pytorch.attention import (RotaryPositionEmbedding, apply_fused_qkv_rotary_pos_emb,
                                                  apply_rotary_pos_emb)


def by_sequence(t, tensor_format):
    """t with the sequence first (a view)."""
    return t if tensor_format == "sbhd" else t.transpose(0, 1)


def rank_chunks(t, cp_size, rank, dim=0):
    """The rank's two of t's 2 cp_size chunks along dim, concatenated (the load-balanced split)."""
    chunks = t.chunk(2 * cp_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * cp_size - 1 - rank]], dim=dim)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("cp_size", [2, 3])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("start_positions", [False, True])
def test_each_rank_rotates_its_chunks_as_the_whole_sequence_does(fused, tensor_format, cp_size, interleaved,
                                                                 start_positions):
    """Forward and gradient of each rank's chunks equal the whole sequence's (start_positions
    shift every position of a sequence, both chunks of it)."""
    chunk, batch, heads, head_dim = 3, 2, 2, 16
    total = 2 * cp_size * chunk
    starts = torch.tensor([5, 2]) if start_positions else None
    freqs = RotaryPositionEmbedding(12, interleaved=interleaved)(total + 5)
    whole = torch.randn(total, batch, heads, head_dim, requires_grad=True)  # [s, b, h, d]
    grad_whole = torch.randn_like(whole)
    want = apply_rotary_pos_emb(whole, freqs, "sbhd", starts, interleaved=interleaved, fused=fused)
    want_grad, = torch.autograd.grad(want, whole, grad_whole)
    for rank in range(cp_size):
        local = rank_chunks(whole.detach(), cp_size, rank)  # [2 chunk, b, h, d]
        grad_local = rank_chunks(grad_whole, cp_size, rank)
        if tensor_format == "bshd":
            local, grad_local = local.transpose(0, 1).contiguous(), grad_local.transpose(0, 1)
        local.requires_grad_()
        got = apply_rotary_pos_emb(local, freqs, tensor_format, starts, interleaved=interleaved, fused=fused,
                                   cp_size=cp_size, cp_rank=rank)
        assert got.is_contiguous()
        grad, = torch.autograd.grad(got, local, grad_local)
        assert_close(by_sequence(got, tensor_format), rank_chunks(want, cp_size, rank), name=f"rank {rank}")
        # The whole sequence's gradient restricted to the rank's chunks: RoPE mixes channels, not tokens.
        assert_close(by_sequence(grad, tensor_format), rank_chunks(want_grad, cp_size, rank), name=f"grad {rank}")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("cp_size", [1, 2, 3])
@pytest.mark.parametrize("start_positions", [False, True])
def test_thd_ranks_rotate_their_chunks_of_each_packed_sequence(fused, cp_size, start_positions):
    """thd: cu_seqlens are the global (padded) offsets; each rank holds two chunks of every
    sequence, packed one sequence after another, and rotates them as the whole sequence does."""
    heads, head_dim = 2, 8
    lengths = [2 * cp_size * n for n in (1, 3, 0, 2)]  # padded to 2 cp_size; one empty sequence
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    starts = torch.tensor([3, 0, 7, 1], dtype=torch.int32) if start_positions else None
    freqs = RotaryPositionEmbedding(head_dim)(max(lengths) + 7)
    whole = torch.randn(int(cu_seqlens[-1]), heads, head_dim)  # [t, h, d]
    sequences = whole.split(lengths)
    for rank in range(cp_size):
        want = torch.cat([rank_chunks(apply_rotary_pos_emb(seq[:, None], freqs, "sbhd", None if starts is None
                                                           else starts[i:i + 1], fused=False), cp_size, rank)
                          for i, seq in enumerate(sequences)])[:, 0]
        local = torch.cat([rank_chunks(seq, cp_size, rank) for seq in sequences]).requires_grad_()
        got = apply_rotary_pos_emb(local, freqs, "thd", starts, fused=fused, cu_seqlens=cu_seqlens, cp_size=cp_size,
                                   cp_rank=rank)
        assert_close(got, want, name=f"rank {rank}")
        grad_out = torch.randn_like(got)
        grad, = torch.autograd.grad(got, local, grad_out)
        # RoPE is a rotation per token: its gradient is the inverse rotation, i.e. angles negated.
        back = apply_rotary_pos_emb(grad_out, -freqs, "thd", starts, fused=False, cu_seqlens=cu_seqlens,
                                    cp_size=cp_size, cp_rank=rank)
        assert_close(grad, back, name=f"grad {rank}")


def unfused_qkv(qkv, q_freqs, k_freqs, split, tensor_format, **kwargs):
    query, key, value = torch.split(qkv, split, dim=-1)
    query = query.reshape(*query.shape[:2], -1, split[1])
    rotate = lambda t, f: apply_rotary_pos_emb(t, f, tensor_format, fused=True, **kwargs)  # noqa: E731
    return rotate(query, q_freqs), rotate(key, k_freqs), value


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("start_positions", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_qkv_rope_equals_rotating_the_split_query_and_key(tensor_format, interleaved, start_positions, dtype):
    seq, batch, groups, head_dim = 7, 2, 3, 16
    split = [4 * head_dim, head_dim, head_dim]  # four query heads per key/value head
    qkv = torch.randn(seq, batch, groups, sum(split)).to(dtype)
    if tensor_format == "bshd":
        qkv = qkv.transpose(0, 1).contiguous()
    q_freqs = RotaryPositionEmbedding(head_dim, interleaved=interleaved)(seq + 4)
    k_freqs = RotaryPositionEmbedding(8, interleaved=interleaved)(seq + 4)  # partial rotation of the key
    kwargs = dict(interleaved=interleaved, start_positions=torch.tensor([3, 1]) if start_positions else None)
    fused_in, plain_in = qkv.clone().requires_grad_(), qkv.clone().requires_grad_()
    got = apply_fused_qkv_rotary_pos_emb(fused_in, q_freqs, k_freqs, split, tensor_format, **kwargs)
    want = unfused_qkv(plain_in, q_freqs, k_freqs, split, tensor_format, **kwargs)
    assert got[0].shape[-2:] == (groups * 4, head_dim) and got[2].shape[-1] == head_dim
    for name, g, w in zip(("query", "key", "value"), got, want):
        assert torch.equal(g, w), name
    grads = [torch.randn_like(t) for t in want]
    torch.autograd.backward(got, grads)
    torch.autograd.backward(want, grads)
    assert torch.equal(fused_in.grad, plain_in.grad)


def test_fused_qkv_rope_refuses_what_it_cannot_split():
    qkv, freqs = torch.randn(4, 1, 2, 48), RotaryPositionEmbedding(16)(4)
    with pytest.raises(ValueError, match="adding up"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 8])
    with pytest.raises(ValueError, match="multiple"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [24, 16, 8])
    with pytest.raises(ValueError, match="thd"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 16], tensor_format="thd")
