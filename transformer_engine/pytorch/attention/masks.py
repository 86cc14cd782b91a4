"""Attention masks and position biases with TransformerEngine's conventions.

Every mask here is bool with **True = masked out** (the key is not attended), laid out to
broadcast against scores [b, h, sq, skv]. Padding is described per sequence by a bool tensor
pad [b, s] (True = padded position); sequences are taken as right-padded when their actual
lengths align bottom-right masks, windows and ALiBi, as TransformerEngine does.

Alignment (TE 2.x): 'causal' and 'padding_causal' align top-left (query i sees keys j <= i);
every other type aligns bottom-right by default, i.e. the diagonal ends at the last key: query i
sits at key position i + (skv - sq), with the actual lengths skv, sq of each sequence when
padded. The sliding window (left, right) and ALiBi distances use the same alignment; for the
non-causal types bottom_right_diagonal=False moves it to the top left (aligns_bottom_right).
"""
import math
import warnings
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary")
BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")

# The packed format carries its sequence structure in cu_seqlens: TE treats every thd mask
# type as its padding variant.
_THD_MASK_TYPE = {"no_mask": "padding", "causal": "padding_causal",
                  "causal_bottom_right": "padding_causal_bottom_right"}


def canonical_mask_type(attn_mask_type: str) -> str:
    """TE's spellings 'padding,causal', 'causal,padding' and 'causal_padding' -> 'padding_causal';
    ValueError for unknown types."""
    name = attn_mask_type.replace(",", "_")
    if name == "causal_padding":
        name = "padding_causal"
    if name not in MASK_TYPES:
        raise ValueError(f"attn_mask_type must be one of {', '.join(MASK_TYPES)} "
                         f"(or 'padding,causal', 'causal,padding', 'causal_padding'), got {attn_mask_type!r}")
    return name


def thd_mask_type(attn_mask_type: str) -> str:
    """The mask type TE applies to packed (thd) sequences: the padding variant of the type."""
    if attn_mask_type == "arbitrary":
        raise ValueError("attn_mask_type='arbitrary' is not supported with qkv_format='thd': the packed "
                         "format takes its sequence structure from cu_seqlens_q / cu_seqlens_kv")
    return _THD_MASK_TYPE.get(attn_mask_type, attn_mask_type)


def is_causal(attn_mask_type: str) -> bool:
    return "causal" in attn_mask_type


def aligns_bottom_right(attn_mask_type: str, bottom_right_diagonal: Optional[bool] = None) -> bool:
    """TE's bottom_right_diagonal rule: where the diagonal of windows and ALiBi sits. 'causal' and
    'padding_causal' force top-left, the '*_bottom_right' types force bottom-right; the other
    types take bottom_right_diagonal, bottom-right when it is None."""
    if attn_mask_type in ("causal", "padding_causal"):
        return False
    if attn_mask_type.endswith("bottom_right") or bottom_right_diagonal is None:
        return True
    return bool(bottom_right_diagonal)


def check_set_window_size(attn_mask_type: str, window_size: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """window_size=(left, right) made to fit attn_mask_type, TE 2.18's rule exactly; -1 is unlimited.

    Causal types take (-1, 0) or (>= 0, 0): None gives (-1, 0); (-1, -1) and (>= 0, != 0) keep
    their left bound with right 0, with a warning. The others (no_mask, padding, arbitrary) take
    (-1, -1) or (>= 0, >= 0): None gives (-1, -1); (-1, 0), the causal default, becomes (-1, -1)
    with a warning (a module built causal and called with 'no_mask' attends everywhere). Any other
    negative bound is a ValueError.
    """
    if window_size is None:
        return (-1, 0) if is_causal(attn_mask_type) else (-1, -1)
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if is_causal(attn_mask_type):
        if (left, right) == (-1, 0) or (left >= 0 and right == 0):
            return left, right
        if (left, right) == (-1, -1) or left >= 0:
            warnings.warn(f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={attn_mask_type!r}; "
                          f"got {window_size!r}, using ({left}, 0)")
            return left, 0
        raise ValueError(f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={attn_mask_type!r}, "
                         f"got {window_size!r}")
    if (left, right) == (-1, -1) or (left >= 0 and right >= 0):
        return left, right
    if (left, right) == (-1, 0):
        warnings.warn(f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={attn_mask_type!r}; "
                      "got (-1, 0), using (-1, -1)")
        return -1, -1
    raise ValueError(f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={attn_mask_type!r}, "
                     f"got {window_size!r}")


@dataclass(frozen=True)
class MaskSpec:
    """What a backend must mask.

    causal: 'none', 'top_left' or 'bottom_right': a plain causal mask backends may implement
        structurally (no tensor); only set when `mask` is None.
    mask: bool [b | 1, h | 1, sq, skv] (True = masked out) or None.
    """
    causal: str = "none"
    mask: Optional[Tensor] = None


def causal_mask(alignment: str, sq: int, skv: int, device: torch.device) -> Tensor:
    """bool [sq, skv], True where a causal mask with this alignment drops the key."""
    offset = skv - sq if alignment == "bottom_right" else 0
    return torch.arange(skv, device=device) > torch.arange(sq, device=device).unsqueeze(-1) + offset


def _offsets(bottom_right: bool, sq: int, skv: int, pad_q: Optional[Tensor], pad_kv: Optional[Tensor],
             device: torch.device) -> Union[int, Tensor]:
    """Where query 0 sits among the keys: 0 (top-left), skv - sq, or per sequence
    len_kv - len_q as [b, 1, 1, 1] when padded (bottom-right)."""
    if not bottom_right:
        return 0
    if pad_q is None and pad_kv is None:
        return skv - sq
    len_q = (~pad_q).sum(-1) if pad_q is not None else torch.full((1,), sq, device=device)
    len_kv = (~pad_kv).sum(-1) if pad_kv is not None else torch.full((1,), skv, device=device)
    return (len_kv - len_q).view(-1, 1, 1, 1)


def build_mask(attn_mask_type: str, window: Tuple[int, int], sq: int, skv: int, device: torch.device,
               pad_q: Optional[Tensor] = None, pad_kv: Optional[Tensor] = None,
               arbitrary: Optional[Tensor] = None, bottom_right_diagonal: Optional[bool] = None) -> MaskSpec:
    """The mask for one attention call.

    attn_mask_type: canonical name; window: resolved (left, right) (check_set_window_size).
    bottom_right_diagonal: where the window's diagonal sits for the non-causal types
        (aligns_bottom_right); the causal types fix it themselves.
    pad_q [b, sq], pad_kv [b, skv]: bool, True = padded (used by the padding types only).
    arbitrary: bool, broadcastable to [b, h, sq, skv] (used by 'arbitrary' only).
    A plain causal mask without padding or a narrower window stays structural.
    """
    padded = "padding" in attn_mask_type and (pad_q is not None or pad_kv is not None)
    bottom_right = aligns_bottom_right(attn_mask_type, bottom_right_diagonal)
    causal_window = window == (-1, 0) and is_causal(attn_mask_type)
    if attn_mask_type == "arbitrary":
        if window == (-1, -1):
            return MaskSpec(mask=arbitrary)
    elif not padded and (window == (-1, -1) or causal_window):
        if not is_causal(attn_mask_type) and window == (-1, -1):
            return MaskSpec()
        return MaskSpec(causal="bottom_right" if bottom_right else "top_left")
    if not padded:
        pad_q = pad_kv = None
    offset = _offsets(bottom_right, sq, skv, pad_q, pad_kv, device)
    query = torch.arange(sq, device=device).view(sq, 1) + offset  # key position of each query
    key = torch.arange(skv, device=device).view(1, skv)
    masked = torch.zeros(1, 1, sq, skv, dtype=torch.bool, device=device)
    left, right = window
    if left >= 0:
        masked = masked | (key < query - left)
    if right >= 0:  # causal types have right == 0 here
        masked = masked | (key > query + right)
    if padded:
        if pad_q is not None:
            masked = masked | pad_q[:, None, :, None]  # [b, 1, sq, 1]
        if pad_kv is not None:
            masked = masked | pad_kv[:, None, None, :]  # [b, 1, 1, skv]
    if arbitrary is not None:
        masked = masked | arbitrary
    return MaskSpec(mask=masked)


def all_masked_rows(mask: Tensor) -> Tensor:
    """bool [..., sq, 1]: True where a query row has every key masked out."""
    return mask.all(dim=-1, keepdim=True)


def default_alibi_slopes(num_heads: int) -> Tensor:
    """The ALiBi paper's slopes, fp32 [num_heads]: 2^(-8 i / n), i = 1..n, for n a power of two;
    otherwise those of the largest power of two below, then every other slope of twice it."""
    def geometric(n: int):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    base = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(base) + geometric(2 * base)[0::2][: num_heads - base]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, attn_mask_type: str, sq: int, skv: int, pad_q: Optional[Tensor] = None,
               pad_kv: Optional[Tensor] = None, bottom_right_diagonal: Optional[bool] = None) -> Tensor:
    """ALiBi as a post-scale bias, fp32 [b | 1, h, sq, skv]: -slope * |query position - key|,
    with the query positions aligned as the mask type and bottom_right_diagonal align them
    (aligns_bottom_right).

    slopes: [h] or [b, h].
    """
    padded = "padding" in attn_mask_type
    offset = _offsets(aligns_bottom_right(attn_mask_type, bottom_right_diagonal), sq, skv, pad_q if padded else None,
                      pad_kv if padded else None, slopes.device)
    query = torch.arange(sq, device=slopes.device).view(sq, 1) + offset
    distance = (query - torch.arange(skv, device=slopes.device)).abs().float()  # [b | 1, 1 | -, sq, skv]
    slopes = slopes.float().view(-1, slopes.shape[-1], 1, 1)  # [b | 1, h, 1, 1]
    return -slopes * distance
