"""What every attention backend receives and the interface it implements.

A backend computes softmax(q k^T * scale + bias, masked) @ v (dropout on the probabilities)
on head-major tensors and declares what it can do: supports(config) returns None when it
can run the call, else one sentence saying why not.
"""
import abc
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..masks import MaskSpec, alibi_of
from ..packing import PackedBatch


@dataclass(frozen=True)
class AttentionConfig:
    """The static description of one call, what selection looks at."""
    dtype: torch.dtype
    device_type: str
    num_heads: int
    num_gqa_groups: int
    head_dim_qk: int
    head_dim_v: int
    causal: str  # MaskSpec.causal
    has_mask: bool
    has_bias: bool  # a bias tensor (post- or pre-scale)
    dropout: float
    has_sink: bool = False  # softmax_type 'off-by-one' / 'learnable'
    has_alibi: bool = False
    dense_mask: bool = False  # a mask only a dense tensor holds: an explicit one, or pads with holes


@dataclass(frozen=True)
class AttentionProblem:
    """One call's tensors besides q, k, v.

    spec: the mask (MaskSpec). bias: float [b | 1, h | 1, sq, skv] added after scaling, or None.
    scale: multiplies q k^T. dropout: probability of dropping an attention probability (0 in eval).
    softmax_offset: fp32 [h], the logit of each head's attention sink (TE's softmax_type
        'off-by-one': zeros, 'learnable': a parameter), or None for the plain softmax. The sink
        joins every row's softmax denominator as exp(offset[h]) and attends to nothing:
        P = exp(S) / (exp(offset[h]) + sum exp(S)).
    page_table: int32 [b, pages per sequence] when k and v are the pools of a paged KV cache,
        [pages, page_size, g, d] (attention/paging.py), whose sequences' first spec.skv
        positions are the keys; None for k, v [b, g, skv, d]. Forward only.
    packed: q, k, v are a thd call's packed tensors [t, h | g, d] (out [t, h, dv] alike) with
        these sequences, whose padded batch `spec` describes; only a backend whose
        reads_packed() accepts the problem sees one (DotProductAttention pads for the others).
    Rows whose every key is masked come out as zeros (and pass no gradient) in every backend.
    """
    spec: MaskSpec
    bias: Optional[Tensor]
    scale: float
    dropout: float
    softmax_offset: Optional[Tensor] = None
    alibi_slopes: Optional[Tensor] = None
    page_table: Optional[Tensor] = None
    packed: Optional[PackedBatch] = None

    def dense_bias(self) -> Optional[Tensor]:
        """bias plus ALiBi as one float tensor [b | 1, h | 1, sq, skv], or None (built on each call)."""
        if self.alibi_slopes is None:
            return self.bias
        alibi = alibi_of(self.alibi_slopes, self.spec)
        return alibi if self.bias is None else self.bias + alibi


def describe(q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> AttentionConfig:
    """q [b, h, sq, dk], k [b, g, skv, dk], v [b, g, skv, dv] (or the pools [pages, page_size,
    g, d] of a paged cache)."""
    kv_heads = k.shape[2] if problem.page_table is not None else k.shape[1]
    return AttentionConfig(dtype=q.dtype, device_type=q.device.type, num_heads=q.shape[1],
                           num_gqa_groups=kv_heads, head_dim_qk=q.shape[-1], head_dim_v=v.shape[-1],
                           causal=problem.spec.causal, has_mask=problem.spec.has_mask,
                           has_bias=problem.bias is not None, dropout=problem.dropout,
                           has_sink=problem.softmax_offset is not None, has_alibi=problem.alibi_slopes is not None,
                           dense_mask=problem.spec.explicit is not None or not problem.spec.trailing_padding)


class AttentionBackend(abc.ABC):
    """Subclasses set `name` and implement supports() and forward().

    reads_16bit: the backend takes 16-bit q/k/v as they are and accumulates in fp32 itself;
    otherwise DotProductAttention widens them to the GEMM policy's dtype first.
    A problem with a page_table reaches forward() only where reads_pages() says so; otherwise
    DotProductAttention gathers the pages into k, v [b, g, skv, d] first."""
    name: str
    reads_16bit = False

    @abc.abstractmethod
    def supports(self, config: AttentionConfig) -> Optional[str]:
        """None if this backend can run `config`, else the reason it cannot."""

    @abc.abstractmethod
    def forward(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> Tensor:
        """q [b, h, sq, dk], k [b, g, skv, dk], v [b, g, skv, dv] (g divides h; query head i
        uses key/value head i // (h / g)) -> [b, h, sq, dv] in q's dtype."""

    def forward_with_max_logit(self, q: Tensor, k: Tensor, v: Tensor,
                               problem: AttentionProblem) -> Tuple[Tensor, Optional[Tensor]]:
        """(forward(), the per-head max logit fp32 [h] when the backend has it at no cost, else None)."""
        return self.forward(q, k, v, problem), None

    def run(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem,
            with_max_logit: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """forward_with_max_logit() when the max logit is wanted, else (forward(), None)."""
        if with_max_logit:
            return self.forward_with_max_logit(q, k, v, problem)
        return self.forward(q, k, v, problem), None

    def reads_pages(self, problem: AttentionProblem, wants_grad: bool) -> bool:
        """Whether forward() takes problem.page_table's pools as they are."""
        return False

    def reads_packed(self, problem: AttentionProblem) -> bool:
        """Whether forward() takes a thd call's packed q, k, v as they are (problem.packed)."""
        return False
