"""Attention on this package's flash kernel (te.kernels.flash_attention): kernels/cpu/attention
on the CPU, triton/attention.py on CUDA and MUSA (for what it takes: no bias tensor, dense mask
or dropout, which PyTorch's SDPA then serves).

The mask goes in by its structure where it has one (window, alignment, each sequence's length)
and ALiBi by its slopes, so sliding windows, bottom-right causal masks, padding and packed
sequences cost time and memory in proportion to what they let through, never O(sq * skv).
What has no structure (an 'arbitrary' mask, pad masks with holes, a bias tensor) goes in as the
dense tensor it is, read by broadcast; sinks, dropout and the max logit are the kernel's own.
16-bit q/k/v are read as they are: the kernel widens each tile to fp32. A thd call's packed
q/k/v go in as they are, with their cu_seqlens.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ...custom_ops._registry import ACCELERATOR_KEYS
from ...custom_ops.attention import MAX_HEAD_DIM, flash_attention
from ...triton import triton_status
from ..masks import MaskSpec, sequence_lengths
from .base import AttentionBackend, AttentionConfig, AttentionProblem

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TRITON_MAX_HEAD_DIM = 256  # triton/attention.py's MAX_HEAD_DIM (that module imports triton)


class FlashBackend(AttentionBackend):
    name = "flash"
    reads_16bit = True

    def supports(self, config: AttentionConfig) -> Optional[str]:
        if config.device_type != "cpu" and config.device_type not in ACCELERATOR_KEYS:
            return f"the flash kernel runs on the CPU, CUDA and MUSA (this call is on {config.device_type})"
        if config.dtype not in DTYPES:
            return f"the flash kernel takes float32, bfloat16 or float16 q/k/v, got {config.dtype}"
        if config.device_type != "cpu":
            return _triton_refusal(config)
        if max(config.head_dim_qk, config.head_dim_v) > MAX_HEAD_DIM:
            return f"the flash kernel takes head dims up to {MAX_HEAD_DIM}, got ({config.head_dim_qk}, {config.head_dim_v})"
        return None

    def reads_pages(self, problem: AttentionProblem, wants_grad: bool) -> bool:
        """The kernel reads a paged cache through its page table in a forward without a bias
        tensor or an explicit mask (decoding); it has no backward over pages."""
        return problem.bias is None and problem.spec.explicit is None and not wants_grad

    def reads_packed(self, problem: AttentionProblem) -> bool:
        """The kernel walks packed sequences by their cu_seqlens (and padded starts), unless a
        dense bias or mask laid out over the padded batch comes with them."""
        return problem.bias is None and problem.spec.explicit is None and problem.page_table is None

    def forward(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> Tensor:
        return self._attend(q, k, v, problem, return_max_logit=False)[0]

    def forward_with_max_logit(self, q: Tensor, k: Tensor, v: Tensor,
                               problem: AttentionProblem) -> Tuple[Tensor, Optional[Tensor]]:
        return self._attend(q, k, v, problem, return_max_logit=True)

    @staticmethod
    def _attend(q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem,
                return_max_logit: bool) -> Tuple[Tensor, Optional[Tensor]]:
        out, _, *logit = flash_attention(q, k, v, problem.scale, dropout=problem.dropout, page_table=problem.page_table,
                                         return_max_logit=return_max_logit, **kernel_arguments(q, k, problem))
        return out, (logit[0] if return_max_logit else None)


def _triton_refusal(config: AttentionConfig) -> Optional[str]:
    """Why the Triton flash kernel (the op's implementation on CUDA and MUSA) does not take the
    call, whose dtype the CPU's rule has passed; None when it does."""
    if not triton_status()[0]:
        return f"the flash kernel runs on {config.device_type} through Triton, which is not installed"
    if max(config.head_dim_qk, config.head_dim_v) > TRITON_MAX_HEAD_DIM:
        return (f"the Triton flash kernel takes head dims up to {TRITON_MAX_HEAD_DIM}, got ({config.head_dim_qk}, "
                f"{config.head_dim_v})")
    for refused, what in ((config.has_bias, "bias tensor"), (config.dense_mask, "dense mask"),
                          (config.dropout > 0, "dropout")):
        if refused:
            return f"the Triton flash kernel takes no {what} (SDPA serves the call)"
    return None


def kernel_arguments(q: Tensor, k: Tensor, problem: AttentionProblem) -> dict:
    """The flash ops' mask, sequence, bias, ALiBi and sink arguments for a call (keywords of
    te.kernels.flash_attention): the mask by its structure where it has one, else dense."""
    spec, packed = problem.spec, problem.packed
    cu_seqlens_q_padded = cu_seqlens_kv_padded = None
    if packed is not None:  # q, k, v [t, h | g, d] as the caller packed them
        window, mask = spec.window, None
        cu_seqlens_q, cu_seqlens_kv = packed.cu_seqlens_q, packed.cu_seqlens_kv
        cu_seqlens_q_padded, cu_seqlens_kv_padded = packed.cu_seqlens_q_padded, packed.cu_seqlens_kv_padded
    else:
        skv = spec.skv if problem.page_table is not None else k.shape[2]
        window, cu_seqlens_q, cu_seqlens_kv, mask = _mask_arguments(spec, q.shape[0], q.shape[2], skv, q.device)
    bias = problem.bias
    if bias is not None:  # [b | 1, h | 1, sq, skv] in q's dtype, as SDPA takes it
        bias = bias.to(q.dtype)
    return dict(window_size=window, bottom_right=spec.bottom_right, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
                cu_seqlens_kv_padded=cu_seqlens_kv_padded, alibi_slopes=problem.alibi_slopes, bias=bias, mask=mask,
                softmax_offset=problem.softmax_offset)


def _mask_arguments(spec: MaskSpec, b: int, sq: int, skv: int,
                    device: torch.device) -> Tuple[Tuple[int, int], Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(window, cu_seqlens_q, cu_seqlens_kv, dense mask [b | 1, h | 1, sq, skv]) for the kernel.

    Trailing padding becomes each sequence's length, which also aligns a bottom-right window per
    sequence; an explicit mask joins the window as a dense mask. Pads with holes have no lengths:
    the dense mask then carries them with the window, aligned per sequence (MaskSpec.dense())."""
    padded = spec.pad_q is not None or spec.pad_kv is not None
    if padded and not spec.trailing_padding:
        return (-1, -1), None, None, _full_size(spec.dense(), sq, skv)
    cu_seqlens_q = cu_seqlens_kv = None
    if padded:
        lengths = spec.cu_seqlens or (_cumulative(spec.pad_q, b, sq), _cumulative(spec.pad_kv, b, skv))
        cu_seqlens_q, cu_seqlens_kv = (t.to(device) for t in lengths)  # the ops take them on q's device
    mask = _full_size(spec.explicit, sq, skv) if spec.explicit is not None else None
    return spec.window, cu_seqlens_q, cu_seqlens_kv, mask


def _full_size(mask: Tensor, sq: int, skv: int) -> Tensor:
    """A 4-D mask broadcast over sq and skv (a view): the kernel reads its rows by stride."""
    return mask.expand(mask.shape[0], mask.shape[1], sq, skv)


def _cumulative(pad: Optional[Tensor], b: int, s: int) -> Tensor:
    """int64 [b + 1]: cumulative sequence lengths from pad [b, s] (all s when pad is None)."""
    lengths = torch.full((b,), s, dtype=torch.int64) if pad is None else sequence_lengths(pad).to(torch.int64).cpu()
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
