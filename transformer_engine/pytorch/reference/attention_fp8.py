"""FP8 attention's ops in plain PyTorch (TE's fp8_dpa, emulated): the oracle of
flash_attention_fp8_fwd / flash_attention_fp8_bwd (schemas in bindings/attention_ops.cpp) and
their implementation on accelerators without a kernel.

q, k, v (and the backward's out and grad_out) hold the values of FP8 codes; each sum of products
of code values is taken in fp32 and multiplied once by the product of its operands' scale_invs
(fp32, left to right). Per sequence, with the masks, windows, ALiBi, bias, sink and dropout of
reference/attention.py:
    logits   (scale * q_si * k_si) q.k (+ ALiBi, bias)
    P        exp(logits - lse) * dropout's factors;  P8 = e4m3(P * probs_scale) as values
    out      (probs_si * v_si) P8 v
    D        (grad_out_si * out_si) rowsum(grad_out * out)
    dP       (grad_out_si * v_si) grad_out v^T
    G        P (dP * dropout's factors - D) = dL/dlogits;  G8 = format(G * grad_scores_scale)
    dV       (probs_si * grad_out_si) P8^T grad_out
    dQ, dK   (scale * grad_scores_si * k_si) G8 k,  (scale * grad_scores_si * q_si) G8^T q
probs_amax = max P, grad_scores_amax = max |G| (0 where nothing is seen). out and the gradients
are fp32: the caller rounds them once. Every cast saturates and rounds to nearest even.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .attention import (_expand_heads, _keep, _logits, _max_sq, _probabilities, _rows, _sequences, _terms,
                        _unpaged)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GRAD_SCORES_FORMATS = (E4M3, E5M2)  # grad_scores_format 0, 1


def fp8_values(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tensor:
    """x * scale (fp32) on fp8_dtype's grid, saturating, as fp32 values."""
    limit = torch.finfo(fp8_dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(fp8_dtype).float()


def _factor(*scales: Tensor) -> Tensor:
    """The fp32 product of scales, left to right."""
    product = scales[0]
    for s in scales[1:]:
        product = product * s
    return product


def _scatter(target: Tensor, part: Tensor, packed: bool, i: int, start: int, length: int) -> None:
    """Sequence i's rows [heads, length, d] into target, laid out as q, k or v."""
    if packed:
        target[start:start + length] = part.transpose(0, 1)
    else:
        target[i, :, :length] = part


def flash_attention_fp8_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                            cu_seqlens_kv: Optional[Tensor], cu_seqlens_q_padded: Optional[Tensor],
                            cu_seqlens_kv_padded: Optional[Tensor], alibi_slopes: Optional[Tensor],
                            bias: Optional[Tensor], mask: Optional[Tensor], softmax_offset: Optional[Tensor],
                            dropout_rng: Optional[Tensor], page_table: Optional[Tensor], scale: float,
                            window_left: int, window_right: int, bottom_right: bool, dropout: float,
                            return_max_logit: bool, fp8_scales: Tensor) -> Tuple[Tensor, ...]:
    q_si, k_si, v_si, probs_scale, probs_si = fp8_scales.float().unbind()
    if page_table is not None:
        k, v = _unpaged(q, k, page_table, cu_seqlens_kv), _unpaged(q, v, page_table, cu_seqlens_kv)
    logit_scale = _factor(torch.tensor(scale, dtype=torch.float32), q_si, k_si).item()
    terms = _terms(alibi_slopes, bias, mask, softmax_offset, dropout_rng, logit_scale, window_left, window_right,
                   bottom_right, 0.0, dropout)
    packed, heads = q.dim() == 3, q.shape[1]
    qc, kc, vc = q.float(), k.float(), v.float()
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64, device=q.device)
    best = torch.full((heads,), float("-inf"), dtype=torch.float32, device=q.device)
    amax = torch.zeros((), dtype=torch.float32, device=q.device)
    sequences = _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    max_sq = _max_sq(sequences)
    for i, lq, lkv, start_q, start_kv in sequences:
        qs = _rows(qc, packed, i, start_q, lq)
        ks, vs = _expand_heads(_rows(kc, packed, i, start_kv, lkv), _rows(vc, packed, i, start_kv, lkv), heads)
        logits, _ = _logits(qs, ks, terms, i)
        if logits.numel():
            best = torch.maximum(best, logits.amax(dim=(1, 2)))
        probs, row_lse = _probabilities(logits, terms)
        keep = _keep(terms, i, heads, lq, lkv, max_sq, torch.float32, q.device)
        kept = probs if keep is None else probs * keep
        if kept.numel():
            amax = torch.maximum(amax, kept.amax())
        o = torch.matmul(fp8_values(kept, probs_scale, E4M3), vs) * _factor(probs_si, v_si)
        _scatter(out, o, packed, i, start_q, lq)
        _scatter(lse, row_lse.double(), packed, i, start_q, lq)
    max_logit = best if return_max_logit else best.new_empty(0)
    return out, lse, max_logit, amax.reshape(1)


def flash_attention_fp8_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                            cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                            cu_seqlens_q_padded: Optional[Tensor], cu_seqlens_kv_padded: Optional[Tensor],
                            alibi_slopes: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor],
                            softmax_offset: Optional[Tensor], dropout_rng: Optional[Tensor],
                            page_table: Optional[Tensor], scale: float, window_left: int, window_right: int,
                            bottom_right: bool, dropout: float, bias_grad: bool, fp8_scales: Tensor,
                            grad_scores_format: int) -> Tuple[Tensor, ...]:
    """(grad_q, grad_k, grad_v, grad_bias, grad_softmax_offset, grad_scores_amax); P recomputed,
    lse unused; grad_bias (G summed over the bias's broadcast dims) only when bias_grad."""
    q_si, k_si, v_si, out_si, do_si, probs_scale, probs_si, gs_scale, gs_si = fp8_scales.float().unbind()
    softmax_scale = torch.tensor(scale, dtype=torch.float32)
    logit_scale = _factor(softmax_scale, q_si, k_si).item()
    terms = _terms(alibi_slopes, bias, mask, softmax_offset, dropout_rng, logit_scale, window_left, window_right,
                   bottom_right, 0.0, dropout)
    packed, heads = q.dim() == 3, q.shape[1]
    qc, kc, vc, oc, dc = (t.float() for t in (q, k, v, out, grad_out))
    grads: List[Tensor] = [torch.zeros_like(t, dtype=torch.float32) for t in (q, k, v)]
    grad_logits = torch.zeros(q.shape[0], heads, q.shape[2], k.shape[2], dtype=torch.float32, device=q.device) \
        if bias_grad and bias is not None else None
    grad_offset = torch.zeros(heads, dtype=torch.float32, device=q.device)
    amax = torch.zeros((), dtype=torch.float32, device=q.device)
    sequences = _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    max_sq = _max_sq(sequences)
    for i, lq, lkv, start_q, start_kv in sequences:
        if lq == 0 or lkv == 0:
            continue
        qs = _rows(qc, packed, i, start_q, lq)
        g = kc.shape[1]
        k_h, v_h = _expand_heads(_rows(kc, packed, i, start_kv, lkv), _rows(vc, packed, i, start_kv, lkv), heads)
        logits, _ = _logits(qs, k_h, terms, i)
        probs, row_lse = _probabilities(logits, terms)
        keep = _keep(terms, i, heads, lq, lkv, max_sq, torch.float32, q.device)
        d_out = _rows(dc, packed, i, start_q, lq)
        delta = (d_out * _rows(oc, packed, i, start_q, lq)).sum(-1, keepdim=True) * _factor(do_si, out_si)
        if softmax_offset is not None:
            sink_probs = torch.exp(softmax_offset.float().view(heads, 1) - row_lse).nan_to_num(0.0)  # [h, lq]
            grad_offset -= (sink_probs * delta.squeeze(-1)).sum(-1)
        d_probs = torch.matmul(d_out, v_h.transpose(-1, -2)) * _factor(do_si, v_si)
        kept = probs if keep is None else probs * keep
        g_logits = probs * ((d_probs if keep is None else d_probs * keep) - delta)
        amax = torch.maximum(amax, g_logits.abs().amax())
        if grad_logits is not None:
            grad_logits[i, :, :lq, :lkv] = g_logits
        g8 = fp8_values(g_logits, gs_scale, GRAD_SCORES_FORMATS[grad_scores_format])
        dq = torch.matmul(g8, k_h) * _factor(softmax_scale, gs_si, k_si)
        dk_g = torch.matmul(g8.transpose(-1, -2), qs).view(g, heads // g, lkv, -1).sum(1) \
            * _factor(softmax_scale, gs_si, q_si)
        dv_g = torch.matmul(fp8_values(kept, probs_scale, E4M3).transpose(-1, -2), d_out) \
            .view(g, heads // g, lkv, -1).sum(1) * _factor(probs_si, do_si)
        _scatter(grads[0], dq, packed, i, start_q, lq)
        _scatter(grads[1], dk_g, packed, i, start_kv, lkv)
        _scatter(grads[2], dv_g, packed, i, start_kv, lkv)
    grad_bias = q.new_empty(0)
    if grad_logits is not None:  # summed over the bias's broadcast dims
        dims = [d for d in (0, 1) if bias.shape[d] == 1 and grad_logits.shape[d] != 1]
        grad_bias = (grad_logits.sum(dims, keepdim=True) if dims else grad_logits).to(bias.dtype)
    grad_sink = grad_offset if softmax_offset is not None else q.new_empty(0, dtype=torch.float32)
    return tuple(grads) + (grad_bias, grad_sink, amax.reshape(1))
