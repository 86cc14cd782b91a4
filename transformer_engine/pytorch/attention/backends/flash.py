"""Attention on this package's flash kernel (te.kernels.flash_attention, kernels/cpu/attention):
the mask read from its structure (window, alignment, each sequence's length) and ALiBi from its
slopes, so sliding windows, bottom-right causal masks, padding and packed sequences cost time
and memory in proportion to what they let through, never O(sq * skv)."""
from typing import Optional

import torch
from torch import Tensor

from ...custom_ops.attention import MAX_HEAD_DIM, flash_attention
from ..masks import sequence_lengths
from .base import AttentionBackend, AttentionConfig, AttentionProblem

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class FlashBackend(AttentionBackend):
    name = "flash"

    def supports(self, config: AttentionConfig) -> Optional[str]:
        if config.device_type != "cpu":
            return f"the flash kernel runs on the CPU (this call is on {config.device_type})"
        if config.dtype not in DTYPES:
            return f"the flash kernel takes float32, bfloat16 or float16 q/k/v, got {config.dtype}"
        if max(config.head_dim_qk, config.head_dim_v) > MAX_HEAD_DIM:
            return f"the flash kernel takes head dims up to {MAX_HEAD_DIM}, got ({config.head_dim_qk}, {config.head_dim_v})"
        if not config.structured_mask:
            return "the flash kernel reads masks by their structure: no 'arbitrary' mask, padding only at the end"
        if config.has_bias:
            return "the flash kernel takes no bias tensor (ALiBi slopes only)"
        if config.has_sink:
            return "the flash kernel has no attention sink (softmax_type 'off-by-one' / 'learnable')"
        if config.dropout > 0:
            return "the flash kernel has no attention dropout"
        return None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> Tensor:
        spec = problem.spec
        cu_seqlens_q = cu_seqlens_kv = None
        if spec.pad_q is not None or spec.pad_kv is not None:  # trailing padding (supports): the lengths say it
            b = q.shape[0]
            cu_seqlens_q = _cumulative(spec.pad_q, b, spec.sq)
            cu_seqlens_kv = _cumulative(spec.pad_kv, b, spec.skv)
        out, _ = flash_attention(q, k, v, problem.scale, spec.window, spec.bottom_right, cu_seqlens_q=cu_seqlens_q,
                                 cu_seqlens_kv=cu_seqlens_kv, alibi_slopes=problem.alibi_slopes)
        return out


def _cumulative(pad: Optional[Tensor], b: int, s: int) -> Tensor:
    """int64 [b + 1]: cumulative sequence lengths from pad [b, s] (all s when pad is None)."""
    lengths = torch.full((b,), s, dtype=torch.int64) if pad is None else sequence_lengths(pad).to(torch.int64).cpu()
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
