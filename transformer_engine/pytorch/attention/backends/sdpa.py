"""Attention on torch.nn.functional.scaled_dot_product_attention (PyTorch picks its flash,
memory-efficient or math kernel for the device)."""
from typing import Optional

import torch
from torch import Tensor

from ..masks import all_masked_rows, causal_mask
from .base import AttentionBackend, AttentionConfig, AttentionProblem

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# enable_gqa (PyTorch >= 2.5) lets SDPA share key/value heads without copying them.
_HAS_ENABLE_GQA = torch.__version__ >= "2.5"


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def supports(self, config: AttentionConfig) -> Optional[str]:
        if config.dtype not in FLOAT_DTYPES:
            return f"torch SDPA takes float16, bfloat16, float32 or float64 q/k/v, got {config.dtype}"
        if config.has_sink:
            return "torch SDPA has no attention sink (softmax_type 'off-by-one' / 'learnable')"
        return None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> Tensor:
        sq, skv = q.shape[-2], k.shape[-2]
        spec = problem.spec
        mask = spec.dense()
        bias = problem.dense_bias()
        # SDPA's is_causal aligns top-left, and older PyTorch refuses it together with an
        # attn_mask: a bottom-right causal mask with sq != skv, or any causal mask with a bias,
        # becomes an explicit mask.
        aligned = spec.causal == "top_left" or (spec.causal == "bottom_right" and sq == skv)
        structural = aligned and bias is None
        if spec.causal != "none" and not structural:
            mask = causal_mask(spec.causal, sq, skv, q.device)
        dead = None
        attn_mask = bias.to(q.dtype) if bias is not None else None
        if mask is not None:
            # A row with every key masked would be NaN: let it attend everywhere, zero it below.
            dead = all_masked_rows(mask)  # [b | 1, h | 1, sq, 1]
            mask = mask & ~dead
            if attn_mask is None:
                attn_mask = ~mask  # SDPA's bool mask means True = attend
            else:
                attn_mask = attn_mask.masked_fill(mask, float("-inf"))
        extra = {}
        if q.shape[1] != k.shape[1]:
            if _HAS_ENABLE_GQA:
                extra["enable_gqa"] = True
            else:
                ratio = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(ratio, dim=1), v.repeat_interleave(ratio, dim=1)  # [b, h, skv, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=problem.dropout, is_causal=structural,
            scale=problem.scale, **extra)
        if dead is not None:
            out = out.masked_fill(dead, 0.0)
        return out
