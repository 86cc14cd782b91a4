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


def _attend(q: Tensor, k: Tensor, v: Tensor, slopes: Optional[Tensor], scale: float, window_left: int,
            window_right: int, bottom_right: bool) -> Tuple[Tensor, Tensor]:
    """One sequence: q [h, lq, dk], k [g, lkv, dk], v [g, lkv, dv] (compute dtype) -> out [h, lq, dv], lse [h, lq]."""
    h, lq, g, lkv = q.shape[0], q.shape[1], k.shape[0], k.shape[1]
    k, v = k.repeat_interleave(h // g, dim=0), v.repeat_interleave(h // g, dim=0)  # [h, lkv, d]
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
    lse = torch.logsumexp(logits, dim=-1)  # [h, lq]
    probs = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)  # rows that see nothing: 0
    return torch.matmul(probs, v), lse


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, alibi_slopes,
             scale, window_left, window_right, bottom_right) -> Tuple[Tensor, Tensor]:
    """Differentiable in q, k, v; out in the compute dtype, rows outside every sequence zero."""
    packed = q.dim() == 3
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = q.to(compute), k.to(compute), v.to(compute)
    dv = v.shape[-1]
    out = torch.zeros(q.shape[0], q.shape[1], dv, dtype=compute, device=q.device) if packed else None
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
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
            lse[start_q:start_q + lq] = l.transpose(0, 1).float()
        else:  # [h, lq, dv] padded to [h, sq, dv]
            per_sequence.append(torch.nn.functional.pad(o, (0, 0, 0, q.shape[2] - lq)))
            lse[i, :, :lq] = l.float()
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
    """(grad_q, grad_k, grad_v) of flash_attention_fwd's out; out and lse are recomputed."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        recomputed, _ = _forward(*leaves, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                                 alibi_slopes, scale, window_left, window_right, bottom_right)
        grads = torch.autograd.grad(recomputed, leaves, grad_out.to(recomputed.dtype), allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
