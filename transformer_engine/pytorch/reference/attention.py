"""Flash attention's ops in plain PyTorch: the dense scores of each sequence, masked, softmaxed.

The oracle of flash_attention_fwd / flash_attention_bwd (schemas in bindings/attention_ops.cpp) and
their implementation on accelerators without a kernel. Per sequence i (lengths lq, lkv; packed
tensors: tokens from the start in cu_seqlens_*_padded, else cu_seqlens), query t sits at key
position pos = t + (lkv - lq if bottom_right else 0) and sees keys j with
pos - window_left <= j <= pos + window_right (a bound of -1 is unlimited), 0 <= j < lkv, and
not mask[i, h, t, j]. Its logits are
    s = cap(scale q.k) - slope_h |pos - j| + bias[i, h, t, j],  cap(x) = softcap tanh(x / softcap)
(no cap when softcap is 0); with a sink, exp(softmax_offset[h]) joins each row's denominator;
lse = log of that denominator (-inf, and a zero output row, when it is empty). Dropout keeps a
probability with the factor 1 / (1 - p), drops it with 0, by keep_factors()' Philox draw, the
kernel's. Computed in fp32 (float64 for float64 inputs), one rounding.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .philox import MASK32 as _MASK32, philox4x32



@dataclass(frozen=True)
class Terms:
    """What turns q.k into the probabilities, besides the sequences (the ops' arguments)."""
    alibi_slopes: Optional[Tensor]
    bias: Optional[Tensor]
    mask: Optional[Tensor]
    softmax_offset: Optional[Tensor]
    scale: float
    window_left: int
    window_right: int
    bottom_right: bool
    softcap: float
    dropout: float
    dropout_seed: int
    dropout_offset: int


def _sequences(q: Tensor, k: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
               cu_seqlens_q_padded: Optional[Tensor], cu_seqlens_kv_padded: Optional[Tensor]) -> List[Tuple[int, ...]]:
    """(index, lq, lkv, start_q, start_kv) per sequence; starts are packed token offsets (0 padded)."""
    packed = q.dim() == 3
    if cu_seqlens_q is None:
        return [(i, q.shape[2], k.shape[2], 0, 0) for i in range(q.shape[0])]
    cu_q, cu_kv = cu_seqlens_q.tolist(), cu_seqlens_kv.tolist()
    slot_q = cu_seqlens_q_padded.tolist() if cu_seqlens_q_padded is not None else cu_q
    slot_kv = cu_seqlens_kv_padded.tolist() if cu_seqlens_kv_padded is not None else cu_kv
    return [(i, cu_q[i + 1] - cu_q[i], cu_kv[i + 1] - cu_kv[i], slot_q[i] if packed else 0,
             slot_kv[i] if packed else 0) for i in range(len(cu_q) - 1)]


def _rows(t: Tensor, packed: bool, i: int, start: int, length: int) -> Tensor:
    """Sequence i's rows of t as [heads, length, d]."""
    if packed:
        return t[start:start + length].transpose(0, 1)  # [length, h, d] -> [h, length, d]
    return t[i, :, :length]


def _dense(t: Tensor, i: int, lq: int, lkv: int) -> Tensor:
    """Sequence i's [h | 1, lq, lkv] of a dense [b | 1, h | 1, sq, skv] operand."""
    return t[i if t.shape[0] > 1 else 0, :, :lq, :lkv]


def keep_factors(terms: Terms, row: Tensor, key: Tensor, dtype: torch.dtype) -> Tensor:
    """Dropout's factor of each (counter row, key) pair, broadcast from row and key (int64):
    Philox4x32-10 keyed by the seed, counter (key // 4, row, offset low, offset high), lane key % 4;
    dropped (0) when its top 24 bits over 2^24 are below p, else 1 / (1 - p) (fp32 arithmetic)."""
    row, key = torch.broadcast_tensors(row, key)
    offset = terms.dropout_offset
    counter = torch.stack([key // 4, row & _MASK32, torch.full_like(key, offset & _MASK32),
                           torch.full_like(key, (offset >> 32) & _MASK32)], dim=-1)
    word = philox4x32(counter, terms.dropout_seed).gather(-1, (key % 4).unsqueeze(-1)).squeeze(-1)
    p = torch.tensor(terms.dropout, dtype=torch.float32)
    uniform = (word >> 8).to(torch.float32) * 2.0 ** -24
    kept = torch.tensor(1.0, dtype=torch.float32) / (1 - p)
    return torch.where(uniform < p, torch.zeros_like(uniform), kept).to(dtype)


def _logits(q: Tensor, k: Tensor, terms: Terms, i: int) -> Tuple[Tensor, Optional[Tensor]]:
    """q [h, lq, dk], k [h, lkv, dk] -> (logits [h, lq, lkv], -inf where unseen; the softcap's
    derivative 1 - tanh^2, or None without a cap)."""
    h, lq, lkv = q.shape[0], q.shape[1], k.shape[1]
    pos = torch.arange(lq, device=q.device).view(lq, 1) + (lkv - lq if terms.bottom_right else 0)
    key = torch.arange(lkv, device=q.device).view(1, lkv)
    seen = torch.ones(1, lq, lkv, dtype=torch.bool, device=q.device)
    if terms.window_left >= 0:
        seen = seen & (key >= pos - terms.window_left)
    if terms.window_right >= 0:
        seen = seen & (key <= pos + terms.window_right)
    if terms.mask is not None:
        seen = seen & ~_dense(terms.mask, i, lq, lkv)
    logits = torch.matmul(q, k.transpose(-1, -2)) * terms.scale  # [h, lq, lkv]
    cap_slope = None
    if terms.softcap > 0:
        tanh = torch.tanh(logits / terms.softcap)
        logits, cap_slope = tanh * terms.softcap, 1 - tanh * tanh
    slopes = terms.alibi_slopes
    if slopes is not None:
        slopes = slopes[i] if slopes.dim() == 2 else slopes
        logits = logits - slopes.to(logits.dtype).view(h, 1, 1) * (pos - key).abs().to(logits.dtype)
    if terms.bias is not None:
        logits = logits + _dense(terms.bias, i, lq, lkv).to(logits.dtype)
    return logits.masked_fill(~seen, float("-inf")), cap_slope


def _probabilities(logits: Tensor, terms: Terms) -> Tuple[Tensor, Tensor]:
    """logits [h, lq, lkv] -> (P [h, lq, lkv], lse [h, lq]); rows with an empty denominator give
    zeros and -inf."""
    h = logits.shape[0]
    if terms.softmax_offset is not None:
        sink = terms.softmax_offset.to(logits.dtype).view(h, 1, 1).expand(h, logits.shape[1], 1)
        lse = torch.logsumexp(torch.cat([logits, sink], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)  # an empty row: -inf - -inf
    return probs, lse


def _keep(terms: Terms, i: int, heads: int, lq: int, lkv: int, max_sq: int, dtype: torch.dtype,
          device: torch.device) -> Optional[Tensor]:
    """Sequence i's dropout factors [heads, lq, lkv], or None without dropout."""
    if terms.dropout == 0:
        return None
    row = (i * heads + torch.arange(heads, device=device).view(heads, 1, 1)) * max_sq \
        + torch.arange(lq, device=device).view(1, lq, 1)
    return keep_factors(terms, row, torch.arange(lkv, device=device).view(1, 1, lkv), dtype)


def _expand_heads(k: Tensor, v: Tensor, h: int) -> Tuple[Tensor, Tensor]:
    g = k.shape[0]
    return k.repeat_interleave(h // g, dim=0), v.repeat_interleave(h // g, dim=0)  # [h, lkv, d]


def _max_sq(sequences) -> int:
    """The longest query sequence: the row stride of dropout's counter (the kernel's max_sq)."""
    return max((lq for _, lq, _, _, _ in sequences), default=0)


def _forward(q, k, v, sequences, terms: Terms) -> Tuple[Tensor, Tensor, Tensor]:
    """out in the compute dtype, rows outside every sequence zero; lse fp64; max logit fp32 [h]."""
    packed = q.dim() == 3
    heads = q.shape[1]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = q.to(compute), k.to(compute), v.to(compute)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=compute, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64, device=q.device)
    best = torch.full((heads,), float("-inf"), dtype=torch.float32, device=q.device)
    max_sq = _max_sq(sequences)
    for i, lq, lkv, start_q, start_kv in sequences:
        qs = _rows(qc, packed, i, start_q, lq)
        ks, vs = _expand_heads(_rows(kc, packed, i, start_kv, lkv), _rows(vc, packed, i, start_kv, lkv), heads)
        logits, _ = _logits(qs, ks, terms, i)
        if logits.numel():
            best = torch.maximum(best, logits.amax(dim=(1, 2)).float())
        probs, l = _probabilities(logits, terms)
        keep = _keep(terms, i, heads, lq, lkv, max_sq, compute, q.device)
        o = torch.matmul(probs if keep is None else probs * keep, vs)  # [h, lq, dv]
        if packed:
            out[start_q:start_q + lq] = o.transpose(0, 1)
            lse[start_q:start_q + lq] = l.transpose(0, 1).double()
        else:
            out[i, :, :lq] = o
            lse[i, :, :lq] = l.double()
    return out, lse, best


def _terms(alibi_slopes, bias, mask, softmax_offset, dropout_rng, scale, window_left, window_right, bottom_right,
           softcap, dropout) -> Terms:
    """Terms from the ops' arguments; the seed and offset as unsigned 64-bit integers."""
    seed, offset = dropout_rng.tolist() if dropout_rng is not None and dropout > 0 else (0, 0)
    return Terms(alibi_slopes, bias, mask, softmax_offset, scale, window_left, window_right, bottom_right, softcap,
                 dropout, seed % 2 ** 64, offset % 2 ** 64)


def _unpaged(q: Tensor, cache: Tensor, page_table: Tensor, cu_seqlens_kv: Tensor) -> Tensor:
    """A paged cache [pages, page_size, g, d] as the keys of q's layout: packed [sum of lengths, g, d]
    (sequence i from cu_seqlens_kv[i]) for packed q, else [b, g, pages per sequence * page_size, d]."""
    pages, page_size = page_table.shape[1], cache.shape[1]
    batch = cu_seqlens_kv.shape[0] - 1
    # [b * pages] pages -> [b, pages * page_size, g, d]
    rows = cache[page_table[:batch].long().flatten()].view(batch, pages * page_size, *cache.shape[2:])
    if q.dim() == 4:
        return rows.transpose(1, 2)
    lengths = cu_seqlens_kv.diff().tolist()
    return torch.cat([rows[i, :length] for i, length in enumerate(lengths)]) if lengths else rows.new_zeros(
        0, *cache.shape[2:])


def flash_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                        cu_seqlens_q_padded: Optional[Tensor], cu_seqlens_kv_padded: Optional[Tensor],
                        alibi_slopes: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor],
                        softmax_offset: Optional[Tensor], dropout_rng: Optional[Tensor], page_table: Optional[Tensor],
                        scale: float, window_left: int, window_right: int, bottom_right: bool, softcap: float,
                        dropout: float, return_max_logit: bool) -> Tuple[Tensor, Tensor, Tensor]:
    if page_table is not None:
        k, v = _unpaged(q, k, page_table, cu_seqlens_kv), _unpaged(q, v, page_table, cu_seqlens_kv)
    terms = _terms(alibi_slopes, bias, mask, softmax_offset, dropout_rng, scale, window_left, window_right,
                   bottom_right, softcap, dropout)
    sequences = _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    out, lse, best = _forward(q, k, v, sequences, terms)
    return out.to(q.dtype), lse, best if return_max_logit else best.new_empty(0)


def flash_attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                        cu_seqlens_q_padded: Optional[Tensor], cu_seqlens_kv_padded: Optional[Tensor],
                        alibi_slopes: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor],
                        softmax_offset: Optional[Tensor], dropout_rng: Optional[Tensor], page_table: Optional[Tensor],
                        scale: float, window_left: int, window_right: int, bottom_right: bool, softcap: float,
                        dropout: float, bias_grad: bool) -> Tuple[Tensor, ...]:
    """(grad_q, grad_k, grad_v, grad_bias, grad_softmax_offset): the softmax's gradient with
    D = rowsum(grad_out * out) taken from the given out, as FlashAttention's backward defines it
    (out rounded to its dtype included); P recomputed, lse unused. grad_bias (bias's shape and
    dtype) only when bias_grad, grad_softmax_offset (fp32 [h]) only with a sink; else empty."""
    terms = _terms(alibi_slopes, bias, mask, softmax_offset, dropout_rng, scale, window_left, window_right,
                   bottom_right, softcap, dropout)
    packed = q.dim() == 3
    heads = q.shape[1]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc, oc, dc = (t.to(compute) for t in (q, k, v, out, grad_out))
    grads = [torch.zeros_like(t, dtype=compute) for t in (q, k, v)]
    grad_logits = torch.zeros(q.shape[0], heads, q.shape[2], k.shape[2], dtype=compute, device=q.device) \
        if bias_grad and bias is not None else None
    grad_offset = torch.zeros(heads, dtype=compute, device=q.device)
    sequences = _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    max_sq = _max_sq(sequences)
    for i, lq, lkv, start_q, start_kv in sequences:
        if lq == 0 or lkv == 0:
            continue
        qs = _rows(qc, packed, i, start_q, lq)
        g = kc.shape[1]
        k_h, v_h = _expand_heads(_rows(kc, packed, i, start_kv, lkv), _rows(vc, packed, i, start_kv, lkv), heads)
        logits, cap_slope = _logits(qs, k_h, terms, i)
        probs, l = _probabilities(logits, terms)  # [h, lq, lkv], [h, lq]
        keep = _keep(terms, i, heads, lq, lkv, max_sq, compute, q.device)
        d_out = _rows(dc, packed, i, start_q, lq)  # [h, lq, dv]
        delta = (d_out * _rows(oc, packed, i, start_q, lq)).sum(-1, keepdim=True)  # [h, lq, 1]
        if softmax_offset is not None:
            sink_probs = torch.exp(softmax_offset.to(compute).view(heads, 1) - l).nan_to_num(0.0)  # [h, lq]
            grad_offset -= (sink_probs * delta.squeeze(-1)).sum(-1)
        d_probs = torch.matmul(d_out, v_h.transpose(-1, -2))
        kept = probs if keep is None else probs * keep
        g_logits = probs * ((d_probs if keep is None else d_probs * keep) - delta)  # dL/ds
        if grad_logits is not None:
            grad_logits[i, :, :lq, :lkv] = g_logits
        d_scores = (g_logits if cap_slope is None else g_logits * cap_slope) * scale
        dq, dk_h, dv_h = (torch.matmul(d_scores, k_h), torch.matmul(d_scores.transpose(-1, -2), qs),
                          torch.matmul(kept.transpose(-1, -2), d_out))
        dk_g = dk_h.view(g, heads // g, lkv, -1).sum(1)  # the query heads of each key/value head
        dv_g = dv_h.view(g, heads // g, lkv, -1).sum(1)
        for grad, part, start, length in ((grads[0], dq, start_q, lq), (grads[1], dk_g, start_kv, lkv),
                                          (grads[2], dv_g, start_kv, lkv)):
            if packed:
                grad[start:start + length] = part.transpose(0, 1)
            else:
                grad[i, :, :length] = part
    grad_bias = q.new_empty(0)
    if grad_logits is not None:  # summed over the bias's broadcast dims
        dims = [d for d in (0, 1) if bias.shape[d] == 1 and grad_logits.shape[d] != 1]
        grad_bias = (grad_logits.sum(dims, keepdim=True) if dims else grad_logits).to(bias.dtype)
    grad_sink = grad_offset.float() if softmax_offset is not None else q.new_empty(0, dtype=torch.float32)
    return tuple(grad.to(t.dtype) for grad, t in zip(grads, (q, k, v))) + (grad_bias, grad_sink)
