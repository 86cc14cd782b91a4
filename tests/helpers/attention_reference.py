"""Plain-PyTorch attention written from the documented semantics, for the DotProductAttention tests.

Everything here is independent of transformer_engine.pytorch.attention: masks are built
element by element from TE's rules (True = attend in `keep`).
"""
import torch


def keep_matrix(mask_type, sq, skv, len_q=None, len_kv=None, window=(-1, -1), bottom_right_diagonal=None):
    """bool [sq, skv], True where query i attends key j, for one sequence pair.

    len_q / len_kv: actual lengths when the type pads (positions past them are padding).
    Causal types force the window's right bound to 0; 'causal' / 'padding_causal' align the
    diagonal top-left, the '*_bottom_right' types bottom-right (to the actual lengths), the
    others bottom-right unless bottom_right_diagonal is False.
    """
    len_q = sq if len_q is None or "padding" not in mask_type else len_q
    len_kv = skv if len_kv is None or "padding" not in mask_type else len_kv
    left, right = window
    if "causal" in mask_type:
        right = 0
    top_left = mask_type in ("causal", "padding_causal") or (
        bottom_right_diagonal is False and not mask_type.endswith("bottom_right"))
    offset = 0 if top_left else len_kv - len_q
    keep = torch.zeros(sq, skv, dtype=torch.bool)
    for i in range(sq):
        for j in range(skv):
            if i >= len_q or j >= len_kv:
                continue
            if left >= 0 and j < i + offset - left:
                continue
            if right >= 0 and j > i + offset + right:
                continue
            keep[i, j] = True
    return keep


def attention(q, k, v, keep=None, bias=None, scale=None, dtype=torch.float64, sink=None):
    """q [b, h, sq, dk], k [b, g, skv, dk], v [b, g, skv, dv] -> [b, h, sq, dv] computed in
    `dtype` (softmax in fp32 at least); keep bool broadcastable to [b, h, sq, skv]; rows with
    no key kept give 0. sink [h]: the logit of an extra key per head that every row's softmax
    includes and whose value is zero (TE's softmax_type 'off-by-one' / 'learnable')."""
    h, g = q.shape[1], k.shape[1]
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    k = k.repeat_interleave(h // g, dim=1)
    v = v.repeat_interleave(h // g, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(dtype)
    soft_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    scores = scores.to(soft_dtype)
    if keep is not None:
        dead = ~keep.any(-1, keepdim=True)  # queries with no key: softmax of 0s, then zeroed
        scores = scores.masked_fill(~keep, float("-inf")).masked_fill(dead, 0.0)
    if sink is not None:
        column = sink.to(soft_dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    if keep is not None:
        probs = probs.masked_fill(dead, 0.0)
    return probs.to(dtype) @ v
