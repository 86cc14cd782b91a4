"""Rotary position embedding with TransformerEngine's API.

    rope = RotaryPositionEmbedding(head_dim)
    freqs = rope(max_seq_len)                               # [max_seq_len, 1, 1, head_dim] fp32
    q = apply_rotary_pos_emb(q, freqs, "sbhd", fused=True)  # q [s, b, h, head_dim]
"""
import functools
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from ..custom_ops.rope import rope
from .packing import check_cu_seqlens


class RotaryPositionEmbedding(torch.nn.Module):
    """The angles of rotary position embeddings.

    dim: head dim; only int(dim * rotary_percent) channels rotate. inv_freq[i] =
    1 / rotary_base^(2i / rotary_dim). forward(max_seq_len, offset=0) returns float32 angles
    [max_seq_len, 1, 1, rotary_dim] for positions offset .. offset + max_seq_len - 1:
    cat(f, f) over the halves, or each angle repeated on its adjacent pair when interleaved.
    seq_len_interpolation_factor divides the positions (linear interpolation); together with
    pretrained_max_position_embeddings, sequences longer than pretrained * factor are scaled by
    pretrained / max_seq_len instead (dynamic scaling).
    """

    def __init__(self, dim: int, rotary_percent: float = 1.0, seq_len_interpolation_factor: Optional[float] = None,
                 pretrained_max_position_embeddings: Optional[int] = None, rotary_base: float = 10000.0,
                 interleaved: bool = False):
        super().__init__()
        if not 0 < rotary_percent <= 1:
            raise ValueError(f"rotary_percent must be in (0, 1], got {rotary_percent}")
        rotary_dim = int(dim * rotary_percent)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"the rotary dim int(dim * rotary_percent) = int({dim} * {rotary_percent}) = {rotary_dim} "
                             "must be even and at least 2")
        self.rotary_dim = rotary_dim
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.interleaved = interleaved
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
        self.register_buffer("inv_freq", 1.0 / rotary_base ** exponents, persistent=False)

    def forward(self, max_seq_len: int, offset: int = 0) -> Tensor:
        positions = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        factor = self.seq_len_interpolation_factor
        if factor is not None:
            pretrained = self.pretrained_max_position_embeddings
            if pretrained is not None and max_seq_len > pretrained * factor:
                positions = positions * (pretrained / max_seq_len)
            else:
                positions = positions * (1 / factor)
        freqs = torch.outer(positions, self.inv_freq)  # [s, rotary_dim / 2]
        if self.interleaved:
            emb = freqs.repeat_interleave(2, dim=-1)  # f0 f0 f1 f1 ...
        else:
            emb = torch.cat((freqs, freqs), dim=-1)  # f0 f1 ... f0 f1 ...
        return emb.reshape(max_seq_len, 1, 1, self.rotary_dim)


def _check_cp_rank(cp_size: int, cp_rank: int) -> None:
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"apply_rotary_pos_emb: cp_rank must be in [0, cp_size), got cp_rank={cp_rank}, "
                         f"cp_size={cp_size}")


def _context_parallel_chunk(t: Tensor, tensor_format: str, freqs: Tensor, cp_size: int, cp_rank: int):
    """sbhd / bshd under context parallelism: the local sequence is two equal chunks of the
    global one, chunks cp_rank and 2 cp_size - 1 - cp_rank of 2 cp_size (the load-balanced
    split). Returns (chunk length, the global positions where the two chunks start)."""
    local = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
    if local % 2:
        raise ValueError(f"apply_rotary_pos_emb: with cp_size={cp_size} the local sequence ({local} tokens) must hold "
                         "two equal chunks")
    chunk = local // 2
    if freqs.shape[0] < 2 * cp_size * chunk:
        raise ValueError(f"apply_rotary_pos_emb: freqs covers {freqs.shape[0]} positions, the sequence split over "
                         f"{cp_size} ranks has {2 * cp_size * chunk}")
    return chunk, (cp_rank * chunk, (2 * cp_size - 1 - cp_rank) * chunk)


def _context_parallel_sequences(cu_seqlens: Tensor, start_positions: Optional[Tensor], cp_size: int,
                                cp_rank: int) -> Tuple[Tensor, Tensor]:
    """thd under context parallelism: cu_seqlens are the global (padded) offsets; this rank holds
    each sequence's two chunks, as sbhd does. Each chunk is a run of consecutive positions, so
    the local tokens are packed sequences of their own: returns their cu_seqlens [2b + 1] (over
    the local tokens) and start positions [2b] (the chunk's first global position, plus the
    sequence's start_positions)."""
    if not torch.compiler.is_compiling() and bool((cu_seqlens % (2 * cp_size) != 0).any()):
        raise ValueError(f"apply_rotary_pos_emb: with cp_size={cp_size}, every sequence in cu_seqlens must be padded "
                         f"to a multiple of 2 * cp_size = {2 * cp_size} tokens, got {cu_seqlens.tolist()}")
    local = cu_seqlens // cp_size  # [b + 1] offsets of the local tokens
    chunk = (local[1:] - local[:-1]) // 2  # [b]
    chunk_cu = torch.cat((torch.stack((local[:-1], local[:-1] + chunk), dim=1).flatten(), local[-1:]))  # [2b + 1]
    full = chunk * 2 * cp_size
    starts = torch.stack((cp_rank * chunk, full - (cp_rank + 1) * chunk), dim=1).flatten()  # [2b]
    if start_positions is not None:
        starts = starts + start_positions.to(starts.dtype).repeat_interleave(2)
    return chunk_cu, starts


def _rope(t: Tensor, freqs: Tensor, tensor_format: str, start_positions: Optional[Tensor], interleaved: bool,
          fused: bool, cu_seqlens: Optional[Tensor]) -> Tensor:
    if fused:  # the kernel takes fp32 angles: bf16 / fp16 ones are exact in fp32
        return rope(t, freqs.float(), tensor_format, interleaved, cu_seqlens, start_positions)
    return reference.rope_fwd(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions)


def apply_rotary_pos_emb(t: Tensor, freqs: Tensor, tensor_format: str = "sbhd",
                         start_positions: Optional[Tensor] = None, interleaved: bool = False, fused: bool = False,
                         cu_seqlens: Optional[Tensor] = None, cp_size: int = 1, cp_rank: int = 0) -> Tensor:
    """Rotates the first freqs.shape[-1] channels of every head of t by its position's angles.

    t: [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd', with cu_seqlens [b + 1]
    int32/int64 marking the packed sequences; positions restart at each sequence start).
    freqs: [max_seq_len, 1, 1, d2] angles (RotaryPositionEmbedding's output), d2 even, <= d; float32,
        or a 16-bit float converted to float32.
    start_positions: optional [b] offset added to every position of sequence b.
    fused=True runs the fused kernel (gradient for t only, as TransformerEngine's fused path);
    fused=False the plain-PyTorch version, differentiable in t and freqs. Both compute in fp32
    and return t's dtype.
    cp_size, cp_rank: context parallelism. t holds this rank's 2 of each sequence's 2 cp_size
    chunks, chunks cp_rank and 2 cp_size - 1 - cp_rank (the load-balanced split), and freqs
    covers the whole sequence; for 'thd', cu_seqlens are the global offsets, each sequence
    padded to a multiple of 2 cp_size tokens (TE's cu_seqlens_padded).
    """
    _check_cp_rank(cp_size, cp_rank)
    if tensor_format == "thd" and cu_seqlens is not None:
        check_cu_seqlens("cu_seqlens", cu_seqlens, t.shape[0] * cp_size)
        if cp_size != 1:
            cu_seqlens, start_positions = _context_parallel_sequences(cu_seqlens, start_positions, cp_size, cp_rank)
    elif cp_size != 1 and tensor_format in ("sbhd", "bshd"):
        chunk, starts = _context_parallel_chunk(t, tensor_format, freqs, cp_size, cp_rank)
        if start_positions is None:  # the angles of the local positions, in order: one call
            freqs = torch.cat([freqs[start:start + chunk] for start in starts])  # [2 chunk, 1, 1, d2]
        else:  # each sequence's offset moves both chunks: one call per chunk, freqs from its first position
            seq_dim = 0 if tensor_format == "sbhd" else 1
            return torch.cat([_rope(t.narrow(seq_dim, index * chunk, chunk), freqs[start:], tensor_format,
                                    start_positions, interleaved, fused, None)
                              for index, start in enumerate(starts)], dim=seq_dim)
    return _rope(t, freqs, tensor_format, start_positions, interleaved, fused, cu_seqlens)


def apply_fused_qkv_rotary_pos_emb(qkv: Tensor, q_freqs: Tensor, k_freqs: Tensor, qkv_split_arg_list: List[int],
                                   tensor_format: str = "sbhd", start_positions: Optional[Tensor] = None,
                                   interleaved: bool = False, cu_seqlens: Optional[Tensor] = None, cp_size: int = 1,
                                   cp_rank: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """RoPE of the query and key of a fused projection's output, TransformerEngine's API.

    qkv: [s, b, h, dq + dk + dv] ('sbhd') or [b, s, h, ...] ('bshd'), the last dimension split by
    qkv_split_arg_list = [dq, dk, dv]; dk is the head size, and the dq / dk query heads of each
    group h come first. Returns (query [.., h * dq / dk, dk] rotated by q_freqs, key [.., h, dk]
    rotated by k_freqs, value [.., h, dv] unchanged), each through the fused kernel
    (differentiable in qkv). cu_seqlens is accepted and unused, as in TE ('thd' is refused).
    """
    where = "apply_fused_qkv_rotary_pos_emb"
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"{where}: tensor_format must be 'sbhd' or 'bshd', got {tensor_format!r}")
    if len(qkv_split_arg_list) != 3 or sum(qkv_split_arg_list) != qkv.shape[-1]:
        raise ValueError(f"{where}: qkv_split_arg_list {list(qkv_split_arg_list)} must be three sizes adding up to "
                         f"qkv's last dimension, {qkv.shape[-1]}")
    query_size, head_size, _ = qkv_split_arg_list
    if query_size % head_size:
        raise ValueError(f"{where}: the query's size {query_size} must be a multiple of the key's, {head_size}")
    query, key, value = torch.split(qkv, list(qkv_split_arg_list), dim=-1)
    # [.., h, dq] -> [.., h * dq / dk, dk]: each group's query heads, in order.
    query = query.reshape(*query.shape[:2], -1, head_size)
    rotate = functools.partial(apply_rotary_pos_emb, tensor_format=tensor_format, start_positions=start_positions,
                               interleaved=interleaved, fused=True, cp_size=cp_size, cp_rank=cp_rank)
    return rotate(query, q_freqs), rotate(key, k_freqs), value
