"""Rotary position embedding with TransformerEngine's API.

    rope = RotaryPositionEmbedding(head_dim)
    freqs = rope(max_seq_len)                               # [max_seq_len, 1, 1, head_dim] fp32
    q = apply_rotary_pos_emb(q, freqs, "sbhd", fused=True)  # q [s, b, h, head_dim]
"""
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..ops.rope import rope
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
    and return t's dtype. Context parallelism (cp_size > 1) is not supported.
    """
    if cp_size != 1 or cp_rank != 0:
        raise NotImplementedError(f"apply_rotary_pos_emb: context parallelism (cp_size={cp_size}, cp_rank={cp_rank}) "
                                  "is not supported; pass cp_size=1, cp_rank=0")
    if tensor_format == "thd" and cu_seqlens is not None:
        check_cu_seqlens("cu_seqlens", cu_seqlens, t.shape[0])
    if fused:  # the kernel takes fp32 angles: bf16 / fp16 ones are exact in fp32
        return rope(t, freqs.float(), tensor_format, interleaved, cu_seqlens, start_positions)
    return reference.rope_fwd(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
