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


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("cp_size", [2, 3])
@pytest.mark.parametrize("interleaved", [False, True])
def test_each_rank_rotates_its_chunks_as_the_whole_sequence_does(fused, tensor_format, cp_size, interleaved):
    chunk, batch, heads, head_dim = 3, 2, 2, 16
    total = 2 * cp_size * chunk
    freqs = RotaryPositionEmbedding(12, interleaved=interleaved)(total)
    whole = torch.randn(total, batch, heads, head_dim)  # [s, b, h, d]
    want = by_sequence(apply_rotary_pos_emb(whole, freqs, "sbhd", interleaved=interleaved, fused=fused), "sbhd")
    chunks, want_chunks = whole.split(chunk), want.split(chunk)
    for rank in range(cp_size):
        mirror = 2 * cp_size - 1 - rank
        local = torch.cat([chunks[rank], chunks[mirror]])  # [2 chunk, b, h, d]
        if tensor_format == "bshd":
            local = local.transpose(0, 1).contiguous()
        got = apply_rotary_pos_emb(local, freqs, tensor_format, interleaved=interleaved, fused=fused,
                                   cp_size=cp_size, cp_rank=rank)
        assert_close(by_sequence(got, tensor_format), torch.cat([want_chunks[rank], want_chunks[mirror]]),
                     name=f"rank {rank}")


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
