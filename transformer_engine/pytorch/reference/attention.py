"""Flash attention's ops in plain PyTorch: the dense scores of each sequence, masked, softmaxed.

The oracle of flash_attention_fwd / flash_attention_bwd (schemas in bindings/schemas.cpp) and
their implementation on accelerators without a kernel. Per sequence i (lengths lq, lkv; packed
tensors: tokens from the start in cu_seqlens_*_padded, else cu_seqlens), query t sits at key
position pos = t + (lkv - lq if bottom_right else 0) and sees keys j with
pos - window_left <= j <= pos + window_right (a bound of -1 is unlimited), 0 <= j < lkv;
logits = scale q k^T - slope_h |pos - j|; lse = logsumexp of the seen logits (-inf, and a zero
output row, when none is seen). Computed in fp32 (float64 for float64 inputs), one rounding.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor


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


def _probabilities(q: Tensor, k: Tensor, slopes: Optional[Tensor], scale: float, window_left: int,
                   window_right: int, bottom_right: bool) -> Tensor:
    """q [h, lq, dk], k [h, lkv, dk] -> (P [h, lq, lkv], lse [h, lq]); rows that see no key give
    zeros and -inf."""
    h, lq, lkv = q.shape[0], q.shape[1], k.shape[1]
    pos = torch.arange(lq, device=q.device).view(lq, 1) + (lkv - lq if bottom_right else 0)
    key = torch.arange(lkv, device=q.device).view(1, lkv)
    seen = torch.ones(lq, lkv, dtype=torch.bool, device=q.device)
    if window_left >= 0:
        seen &= key >= pos - window_left
    if window_right >= 0:
        seen &= key <= pos + window_right
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale  # [h, lq, lkv]
    if slopes is not None:
        logits = logits - slopes.to(logits.dtype).view(h, 1, 1) * (pos - key).abs().to(logits.dtype)
    logits = logits.masked_fill(~seen, float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num(0.0), torch.logsumexp(logits, dim=-1)


def _attend(q: Tensor, k: Tensor, v: Tensor, slopes: Optional[Tensor], scale: float, window_left: int,
            window_right: int, bottom_right: bool) -> Tuple[Tensor, Tensor]:
    """One sequence: q [h, lq, dk], k [g, lkv, dk], v [g, lkv, dv] (compute dtype) -> out [h, lq, dv], lse [h, lq]."""
    h, g = q.shape[0], k.shape[0]
    k, v = k.repeat_interleave(h // g, dim=0), v.repeat_interleave(h // g, dim=0)  # [h, lkv, d]
    probs, lse = _probabilities(q, k, slopes, scale, window_left, window_right, bottom_right)
    return torch.matmul(probs, v), lse


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes,
             scale, window_left, window_right, bottom_right) -> Tuple[Tensor, Tensor]:
    """out in the compute dtype, rows outside every sequence zero; lse fp64."""
    packed = q.dim() == 3
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = q.to(compute), k.to(compute), v.to(compute)
    dv = v.shape[-1]
    out = torch.zeros(q.shape[0], q.shape[1], dv, dtype=compute, device=q.device) if packed else None
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64, device=q.device)
    per_sequence = []
    for i, lq, lkv, start_q, start_kv in _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                                    cu_seqlens_kv_padded):
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[i] if alibi_slopes.dim() == 2 else alibi_slopes
        o, l = _attend(_rows(qc, packed, i, start_q, lq), _rows(kc, packed, i, start_kv, lkv),
                       _rows(vc, packed, i, start_kv, lkv), slopes, scale, window_left, window_right, bottom_right)
        if packed:  # o [h, lq, dv] -> the packed rows [lq, h, dv]
            out = out.index_copy(0, torch.arange(start_q, start_q + lq, device=q.device), o.transpose(0, 1))
            lse[start_q:start_q + lq] = l.transpose(0, 1).double()
        else:  # [h, lq, dv] padded to [h, sq, dv]
            per_sequence.append(torch.nn.functional.pad(o, (0, 0, 0, q.shape[2] - lq)))
            lse[i, :, :lq] = l.double()
    if not packed:
        out = torch.stack(per_sequence) if per_sequence else torch.zeros(*q.shape[:-1], dv, dtype=compute,
                                                                         device=q.device)
    return out, lse


def flash_attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                        cu_seqlens_q_padded: Optional[Tensor], cu_seqlens_kv_padded: Optional[Tensor],
                        alibi_slopes: Optional[Tensor], scale: float, window_left: int, window_right: int,
                        bottom_right: bool) -> Tuple[Tensor, Tensor]:
    out, lse = _forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes,
                        scale, window_left, window_right, bottom_right)
    return out.to(q.dtype), lse


def flash_attention_bwd(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                        cu_seqlens_q_padded: Optional[Tensor], cu_seqlens_kv_padded: Optional[Tensor],
                        alibi_slopes: Optional[Tensor], scale: float, window_left: int, window_right: int,
                        bottom_right: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(grad_q, grad_k, grad_v): the softmax's gradient with D = rowsum(grad_out * out) taken from
    the given out, as FlashAttention's backward defines it (out rounded to its dtype included);
    P recomputed, lse unused."""
    packed = q.dim() == 3
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc, oc, dc = (t.to(compute) for t in (q, k, v, out, grad_out))
    grads = [torch.zeros_like(t, dtype=compute) for t in (q, k, v)]
    for i, lq, lkv, start_q, start_kv in _sequences(q, k, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                                    cu_seqlens_kv_padded):
        if lq == 0 or lkv == 0:
            continue
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[i] if alibi_slopes.dim() == 2 else alibi_slopes
        qs, ks, vs = _rows(qc, packed, i, start_q, lq), _rows(kc, packed, i, start_kv, lkv), _rows(vc, packed, i, start_kv, lkv)
        h, g = qs.shape[0], ks.shape[0]
        k_h, v_h = ks.repeat_interleave(h // g, dim=0), vs.repeat_interleave(h // g, dim=0)  # [h, lkv, d]
        probs, _ = _probabilities(qs, k_h, slopes, scale, window_left, window_right, bottom_right)  # [h, lq, lkv]
        d_out = _rows(dc, packed, i, start_q, lq)  # [h, lq, dv]
        delta = (d_out * _rows(oc, packed, i, start_q, lq)).sum(-1, keepdim=True)  # [h, lq, 1]
        d_scores = probs * (torch.matmul(d_out, v_h.transpose(-1, -2)) - delta) * scale
        per_head = (torch.matmul(d_scores, k_h), torch.matmul(d_scores.transpose(-1, -2), qs),
                    torch.matmul(probs.transpose(-1, -2), d_out))
        dq, dk_h, dv_h = per_head
        dk_g = dk_h.view(g, h // g, lkv, -1).sum(1)  # the query heads of each key/value head
        dv_g = dv_h.view(g, h // g, lkv, -1).sum(1)
        for grad, part, start, length in ((grads[0], dq, start_q, lq), (grads[1], dk_g, start_kv, lkv),
                                          (grads[2], dv_g, start_kv, lkv)):
            if packed:
                grad[start:start + length] = part.transpose(0, 1)
            else:
                grad[i, :, :length] = part
    return tuple(grad.to(t.dtype) for grad, t in zip(grads, (q, k, v)))
