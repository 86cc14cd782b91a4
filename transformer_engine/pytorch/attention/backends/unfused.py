"""Attention as two matmuls around the fused softmax ops (TE's 'unfused' backend).

The softmax picks the fused op that fits the mask: scaled_softmax (no mask),
scaled_upper_triang_masked_softmax (top-left causal, square scores),
scaled_aligned_causal_masked_softmax (bottom-right causal), and otherwise
scaled_masked_softmax with the explicit mask. With an attention sink (softmax_offset) the
softmax runs in fp32 over the masked logits and the sink's column, which is then dropped.
"""
from typing import Optional

import torch
from torch import Tensor

from ...custom_ops.softmax import (scaled_aligned_causal_masked_softmax, scaled_masked_softmax, scaled_softmax,
                            scaled_upper_triang_masked_softmax)
from ..masks import all_masked_rows, causal_mask
from .base import AttentionBackend, AttentionConfig, AttentionProblem

SOFTMAX_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class UnfusedBackend(AttentionBackend):
    name = "unfused"

    def supports(self, config: AttentionConfig) -> Optional[str]:
        if config.dtype not in SOFTMAX_DTYPES:
            return f"the fused softmax kernels take float16, bfloat16, float32 or float64 scores, got {config.dtype}"
        return None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> Tensor:
        b, h, sq, _ = q.shape
        g, skv = k.shape[1], k.shape[2]
        # Group the query heads by the key/value head they share: no copy of k or v.
        q5 = q.reshape(b, g, h // g, sq, q.shape[-1])  # [b, g, h/g, sq, dk]
        scores = torch.matmul(q5, k.unsqueeze(2).transpose(-1, -2)).reshape(b, h, sq, skv)
        scale = problem.scale
        bias = problem.dense_bias()
        if bias is not None:  # the bias is added after scaling: scale here, not in the softmax
            scores = (scores * scale + bias).to(q.dtype)
            scale = 1.0
        spec = problem.spec
        mask = spec.dense()
        dead = None
        if problem.softmax_offset is not None:
            probs = _softmax_with_sink(scores, scale, spec.causal, mask, problem.softmax_offset)
        elif mask is not None:
            probs = scaled_masked_softmax(scores, mask, scale)
            # The fused masked softmax gives a fully masked row uniform weights (TE's -10000 rule).
            dead = all_masked_rows(mask)  # [b | 1, h | 1, sq, 1]
        elif spec.causal != "none" and sq == skv:  # both alignments agree on square scores
            probs = scaled_upper_triang_masked_softmax(scores, scale)
        elif spec.causal == "bottom_right":
            probs = scaled_aligned_causal_masked_softmax(scores, scale)
        elif spec.causal == "top_left":  # sq != skv: no fused op aligns top-left on non-square scores
            mask = causal_mask("top_left", sq, skv, q.device).view(1, 1, sq, skv)  # never a fully masked row
            probs = scaled_masked_softmax(scores, mask, scale)
        else:
            probs = scaled_softmax(scores, scale)
        if dead is not None:
            probs = probs.masked_fill(dead, 0.0)
        if problem.dropout > 0:
            probs = torch.nn.functional.dropout(probs, p=problem.dropout)
        out = torch.matmul(probs.reshape(b, g, h // g, sq, skv), v.unsqueeze(2))  # [b, g, h/g, sq, dv]
        return out.reshape(b, h, sq, v.shape[-1])


def _softmax_with_sink(scores: Tensor, scale: float, causal: str, mask: Optional[Tensor],
                       softmax_offset: Tensor) -> Tensor:
    """softmax over [scale * scores (masked), softmax_offset[h]] without the sink's column:
    scores [b, h, sq, skv] -> probabilities [b, h, sq, skv] in scores' dtype, computed in fp32.
    A row whose every key is masked gives the sink all its weight: zeros, and no gradient."""
    b, h, sq, skv = scores.shape
    logits = scores.float() * scale
    if mask is not None:
        logits = logits.masked_fill(mask, float("-inf"))
    elif causal != "none":
        logits = logits.masked_fill(causal_mask(causal, sq, skv, scores.device), float("-inf"))
    sink = softmax_offset.float().view(1, h, 1, 1).expand(b, h, sq, 1)
    return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :skv].to(scores.dtype)
