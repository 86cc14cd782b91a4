"""Packed (thd) sequences <-> a padded batch [b, s_max, ...], by gathers and scatters only.

cu_seqlens [b + 1] (int32, cumulative) gives each sequence's length; cu_seqlens_padded, when
given, gives where each sequence starts in the packed tensor (sequences may be followed by
unused tokens). No host synchronisation happens when max_seqlen is given, so the packed path
traces under torch.compile(fullgraph=True).
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class Packing:
    """Where each (sequence, position) of the padded batch lives in the packed tensor.

    index: int64 [b, s_max], a packed token index, or `tokens` (one past the end) for padding.
    pad: bool [b, s_max], True = padded position.
    tokens: number of packed tokens t.
    """
    index: Tensor
    pad: Tensor
    tokens: int


@dataclass(frozen=True)
class PackedBatch:
    """A thd call's sequences, for a backend that takes q, k, v packed [t, h | g, d] as they are:
    each side's cu_seqlens (int32 [b + 1]) and where its sequences start (cu_seqlens_*_padded,
    None when they lie back to back), with the Packings that pad them for any other backend."""
    cu_seqlens_q: Tensor
    cu_seqlens_kv: Tensor
    cu_seqlens_q_padded: Optional[Tensor]
    cu_seqlens_kv_padded: Optional[Tensor]
    q: Packing
    kv: Packing


def check_cu_seqlens(name: str, cu_seqlens: Tensor, tokens: int, covers_all_tokens: bool = True) -> None:
    """ValueError naming `name` and its values unless cu_seqlens is a 1-D integer tensor that
    starts at 0, never decreases and ends at `tokens` (at most `tokens` when not
    covers_all_tokens: packed tensors may end in tokens no sequence uses). The values are read
    on the host, except while torch.compile traces (reading them would break the graph): then
    only the dtype and rank are checked."""
    if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
        raise ValueError(f"{name} must be a 1-D integer tensor [b + 1], got {cu_seqlens.dtype} of shape "
                         f"{tuple(cu_seqlens.shape)}")
    if torch.compiler.is_compiling():
        return
    values = cu_seqlens.tolist()
    end = f"{'' if covers_all_tokens else 'at most '}{tokens} (the input has {tokens} tokens)"
    if not values or values[0] != 0:
        problem = "is empty" if not values else f"starts at {values[0]}"
        raise ValueError(f"{name} must start at 0 and end at {end}, but it {problem}: {values}")
    drop = next((i for i in range(1, len(values)) if values[i] < values[i - 1]), None)
    if drop is not None:
        i = drop
        raise ValueError(f"{name} must be non-decreasing (no negative sequence length), but {name}[{i}] = "
                         f"{values[i]} < {name}[{i - 1}] = {values[i - 1]}: {values}")
    if values[-1] > tokens or (covers_all_tokens and values[-1] != tokens):
        raise ValueError(f"{name} must end at {end}, but it ends at {values[-1]}: {values}")


def max_seqlen_of(cu_seqlens: Tensor) -> int:
    """The longest sequence (host synchronisation: pass max_seqlen to avoid it)."""
    if cu_seqlens.numel() < 2:
        return 0
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def packing(cu_seqlens: Tensor, cu_seqlens_padded: Optional[Tensor], max_seqlen: int, tokens: int) -> Packing:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # [b]
    starts = (cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens)[:-1].long()  # [b]
    position = torch.arange(max_seqlen, device=cu_seqlens.device)  # [s_max]
    pad = position >= lengths.unsqueeze(-1)  # [b, s_max]
    index = torch.where(pad, tokens, starts.unsqueeze(-1) + position)  # [b, s_max]
    return Packing(index, pad, tokens)


def pad_packed(x: Tensor, p: Packing) -> Tensor:
    """x [t, h, d] -> [b, s_max, h, d], zeros at padded positions."""
    x_ext = torch.cat([x, x.new_zeros(1, *x.shape[1:])])  # [t + 1, h, d]: row t is the zero row
    return x_ext[p.index]


def pack_padded(y: Tensor, p: Packing) -> Tensor:
    """y [b, s_max, ...] -> [t, ...]; packed tokens that no sequence covers are zero."""
    out = y.new_zeros(p.tokens + 1, *y.shape[2:])  # row t collects the padded positions
    out = out.index_put((p.index.flatten(),), y.flatten(0, 1))
    return out[: p.tokens]
