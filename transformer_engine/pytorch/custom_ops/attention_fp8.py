"""FP8 attention (TE's fp8_dpa) as dispatcher ops: argument checks and fake kernels.

The ops (schemas in bindings/attention_ops.cpp; formulas in reference/attention_fp8.py) are
flash_attention_fwd / flash_attention_bwd on q, k, v (and out, grad_out) holding FP8 code values,
without softcap, with fp8_scales (fp32 on the host) and one more output, the amax of P (forward)
or of dL/dlogits (backward); out and the gradients are fp32, rounded once by the caller.
Accelerators run triton/attention_fp8.py where it takes the call, else the reference. The ops
have no autograd of their own: the backward's grad_out is quantised with a scale of its own,
which the caller (the FP8 attention function) owns.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _checks
from ._checks import fail
from ._registry import no_double_backward, serve_on_accelerators
from .attention import _attention, _check_bwd, fake_forward, fake_gradients

_ops = getattr(torch.ops, NAMESPACE)

FWD_SCALES, BWD_SCALES = 5, 9  # the entries of each op's fp8_scales


def _scales(op: str, fp8_scales: Tensor, entries: int) -> None:
    if fp8_scales.device.type != "cpu":
        fail(op, f"fp8_scales must be on the host (CPU), got {fp8_scales.device}")
    _checks.dtype(op, "fp8_scales", fp8_scales, torch.float32)
    _checks.shape(op, "fp8_scales", fp8_scales, (entries,), "the scales and scale_invs the schema lists")
    if _checks.holds_values(fp8_scales) and not bool(torch.isfinite(fp8_scales).all() and (fp8_scales > 0).all()):
        bad = next(i for i, x in enumerate(fp8_scales.tolist()) if not (0 < x < float("inf")))
        fail(op, f"fp8_scales[{bad}] must be finite and positive, got {fp8_scales[bad].item()}")


def _check_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes, bias,
               mask, softmax_offset, dropout_rng, page_table, scale, window_left, window_right, bottom_right, dropout,
               return_max_logit, fp8_scales):
    op = "flash_attention_fp8_fwd"
    _attention(op, q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes,
               bias, mask, softmax_offset, dropout_rng, page_table, window_left, window_right, 0.0, dropout)
    _scales(op, fp8_scales, FWD_SCALES)


def _check_bwd_fp8(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                   cu_seqlens_kv_padded, alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table, scale,
                   window_left, window_right, bottom_right, dropout, bias_grad, fp8_scales, grad_scores_format):
    op = "flash_attention_fp8_bwd"
    if grad_scores_format not in (0, 1):
        fail(op, f"grad_scores_format must be 0 (E4M3) or 1 (E5M2), got {grad_scores_format}")
    _check_bwd(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
               alibi_slopes, bias, mask, softmax_offset, dropout_rng, page_table, scale, window_left, window_right,
               bottom_right, 0.0, dropout, bias_grad, op=op)
    _scales(op, fp8_scales, BWD_SCALES)


_BIAS, _SOFTMAX_OFFSET, _RETURN_MAX_LOGIT = 8, 10, 18  # argument positions


@torch.library.register_fake(f"{NAMESPACE}::flash_attention_fp8_fwd")
def _fwd_fake(q, k, v, *args):
    _check_fwd(q, k, v, *args)
    return (*fake_forward(q, v, args[_RETURN_MAX_LOGIT - 3], torch.float32), q.new_empty(1, dtype=torch.float32))


@torch.library.register_fake(f"{NAMESPACE}::flash_attention_fp8_bwd")
def _bwd_fake(grad_out, q, k, v, out, lse, *args):
    _check_bwd_fp8(grad_out, q, k, v, out, lse, *args)
    grads = fake_gradients(q, k, v, args[_BIAS - 3], args[_SOFTMAX_OFFSET - 3], args[-3], torch.float32)
    return (*grads, q.new_empty(1, dtype=torch.float32))


def _no_autograd(ctx, *grads):
    raise NotImplementedError("flash_attention_fp8_fwd has no autograd of its own: FP8 attention's backward "
                              "quantises grad_out with a scale of its own; run flash_attention_fp8_bwd with its codes")


torch.library.register_autograd(f"{NAMESPACE}::flash_attention_fp8_fwd", _no_autograd)
torch.library.register_autograd(f"{NAMESPACE}::flash_attention_fp8_bwd", no_double_backward("flash_attention_fp8_bwd"))
serve_on_accelerators("flash_attention_fp8_fwd", reference.flash_attention_fp8_fwd, triton_module="attention_fp8",
                      check=_check_fwd)
serve_on_accelerators("flash_attention_fp8_bwd", reference.flash_attention_fp8_bwd, triton_module="attention_fp8",
                      check=_check_bwd_fp8)


def flash_attention_fp8_forward(q: Tensor, k: Tensor, v: Tensor, scale: float, fp8_scales: Tensor,
                                window_size: Tuple[int, int] = (-1, -1), bottom_right: bool = False,
                                cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
                                cu_seqlens_q_padded: Optional[Tensor] = None,
                                cu_seqlens_kv_padded: Optional[Tensor] = None, alibi_slopes: Optional[Tensor] = None,
                                bias: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                                softmax_offset: Optional[Tensor] = None, dropout: float = 0.0,
                                dropout_rng: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(out fp32, lse, probs_amax) of FP8 attention's forward (reference/attention_fp8.py): q, k,
    v hold FP8 code values, fp8_scales = (q_si, k_si, v_si, probs_scale, probs_si) fp32 on the
    host; the other arguments are te.kernels.flash_attention's (dropout_rng required with
    dropout: the backward must draw the same mask)."""
    out, lse, _, amax = _ops.flash_attention_fp8_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes, bias, mask,
        softmax_offset, dropout_rng, None, float(scale), int(window_size[0]), int(window_size[1]), bool(bottom_right),
        float(dropout), False, fp8_scales)
    return out, lse, amax


def flash_attention_fp8_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                 scale: float, fp8_scales: Tensor, grad_scores_format: int,
                                 window_size: Tuple[int, int] = (-1, -1), bottom_right: bool = False,
                                 cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
                                 cu_seqlens_q_padded: Optional[Tensor] = None,
                                 cu_seqlens_kv_padded: Optional[Tensor] = None,
                                 alibi_slopes: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                                 mask: Optional[Tensor] = None, softmax_offset: Optional[Tensor] = None,
                                 dropout: float = 0.0, dropout_rng: Optional[Tensor] = None,
                                 bias_grad: bool = False) -> Tuple[Tensor, ...]:
    """(grad_q, grad_k, grad_v (fp32), grad_bias, grad_softmax_offset, grad_scores_amax) of FP8
    attention's backward: the forward's arguments with grad_out and out (code values), lse,
    fp8_scales = (q_si, k_si, v_si, out_si, grad_out_si, probs_scale, probs_si,
    grad_scores_scale, grad_scores_si) and G's format (0 E4M3, 1 E5M2)."""
    return _ops.flash_attention_fp8_bwd(
        grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
        alibi_slopes, bias, mask, softmax_offset, dropout_rng, None, float(scale), int(window_size[0]),
        int(window_size[1]), bool(bottom_right), float(dropout), bool(bias_grad), fp8_scales, int(grad_scores_format))
