"""The per-head maximum attention logit that QK-clip / MuonClip optimisers read
(DotProductAttention(return_max_logit=True), TE 2.18):

    max_logit[h] = max over (b, sq, skv) of S, S = mask(q k^T * scale + bias)   (fp32 [h])

Only keys the mask lets through count; a head that sees no key at all gets -inf. It is a
statistic, not part of the graph: it carries no gradient. The backends do not return their
scores, so the scores are formed again here, a block of query rows at a time, which bounds the
extra memory to one block of [b, h, rows, skv] fp32 scores.
"""
import torch
from torch import Tensor

from .backends.base import AttentionProblem
from .masks import causal_mask

# Query rows per block: at most this many rows of [b, h, rows, skv] fp32 scores exist at once.
_BLOCK_ROWS = 256


@torch.no_grad()
def max_logit(q: Tensor, k: Tensor, problem: AttentionProblem) -> Tensor:
    """q [b, h, sq, dk], k [b, g, skv, dk] (query head i uses key head i // (h / g)) -> fp32 [h]."""
    b, h, sq, dk = q.shape
    g, skv = k.shape[1], k.shape[2]
    k = k.float().unsqueeze(2).transpose(-1, -2)  # [b, g, 1, dk, skv]
    spec = problem.spec
    mask, bias = spec.dense(), problem.dense_bias()
    causal = causal_mask(spec.causal, sq, skv, q.device) if spec.causal != "none" else None  # [sq, skv]
    best = torch.full((h,), float("-inf"), dtype=torch.float32, device=q.device)
    for start in range(0, sq, _BLOCK_ROWS):
        rows = slice(start, min(start + _BLOCK_ROWS, sq))
        q_block = q[:, :, rows].float().reshape(b, g, h // g, -1, dk)  # [b, g, h/g, rows, dk]
        scores = torch.matmul(q_block, k).reshape(b, h, -1, skv) * problem.scale  # [b, h, rows, skv]
        if bias is not None:
            scores = scores + bias[..., rows, :].float()
        if mask is not None:
            scores = scores.masked_fill(mask[..., rows, :], float("-inf"))
        if causal is not None:
            scores = scores.masked_fill(causal[rows], float("-inf"))
        best = torch.maximum(best, scores.amax(dim=(0, 2, 3)) if scores.numel() else best)
    return best
