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


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """What a backend must mask, by its structure; the dense mask is built only for a backend
    that asks for it (dense()), so a kernel that reads the structure never pays O(sq * skv).

    causal: 'none', 'top_left' or 'bottom_right': the whole mask is a plain causal one, which
        backends may implement without a tensor (window is then (-1, 0)).
    window: (left, right), resolved by check_set_window_size; -1 is unlimited.
    bottom_right: where the window's diagonal sits (aligns_bottom_right): query i at key
        position i + (lkv - lq), with each sequence's actual lengths when padded.
    sq, skv: the padded lengths of the scores.
    pad_q [b, sq], pad_kv [b, skv]: bool, True = padded (padding types only), or None.
    explicit: bool, broadcastable to [b, h, sq, skv], OR-ed into the rest ('arbitrary' masks,
        context parallelism's masks), or None.
    trailing_padding: pad_q / pad_kv pad only the end of each sequence (their lengths,
        sequence_lengths(), say it all, as TE's fused kernels assume).
    cu_seqlens: (cu_seqlens_q, cu_seqlens_kv), int64 [b + 1] on the CPU, the lengths the
        trailing pads were made from where the caller has them as numbers (a KV cache's step),
        so that a kernel taking lengths need not count them back from the pads; or None.
    device: where the dense mask is built.
    """
    causal: str = "none"
    window: Tuple[int, int] = (-1, -1)
    bottom_right: bool = False
    sq: int = 0
    skv: int = 0
    pad_q: Optional[Tensor] = None
    pad_kv: Optional[Tensor] = None
    explicit: Optional[Tensor] = None
    trailing_padding: bool = True
    cu_seqlens: Optional[Tuple[Tensor, Tensor]] = None
    device: torch.device = torch.device("cpu")

    @property
    def has_mask(self) -> bool:
        """Whether anything besides `causal` is masked (dense() is then a tensor)."""
        return (self.explicit is not None or self.pad_q is not None or self.pad_kv is not None
                or (self.causal == "none" and self.window != (-1, -1)))

    def dense(self) -> Optional[Tensor]:
        """bool [b | 1, 1, sq, skv] (or the explicit mask's broadcast shape), True = masked out;
        None when `causal` (or nothing) is all there is. Built anew on each call."""
        if not self.has_mask:
            return None
        if self.pad_q is None and self.pad_kv is None and self.window == (-1, -1):
            return self.explicit
        offset = _offsets(self.bottom_right, self.sq, self.skv, self.pad_q, self.pad_kv, self.device)
        query = torch.arange(self.sq, device=self.device).view(self.sq, 1) + offset  # key position of each query
        key = torch.arange(self.skv, device=self.device).view(1, self.skv)
        masked = torch.zeros(1, 1, self.sq, self.skv, dtype=torch.bool, device=self.device)
        left, right = self.window
        if left >= 0:
            masked = masked | (key < query - left)
        if right >= 0:  # causal types have right == 0 here
            masked = masked | (key > query + right)
        if self.pad_q is not None:
            masked = masked | self.pad_q[:, None, :, None]  # [b, 1, sq, 1]
        if self.pad_kv is not None:
            masked = masked | self.pad_kv[:, None, None, :]  # [b, 1, 1, skv]
        if self.explicit is not None:
            masked = masked | self.explicit
        return masked


def sequence_lengths(pad: Tensor) -> Tensor:
    """pad [b, s] (True = padded) -> int64 [b], the unpadded tokens of each sequence."""
    return (~pad).sum(-1)


def padded_after(lengths: Tensor, s: int) -> Tensor:
    """lengths [b] -> bool [b, s], True from each sequence's length on."""
    return torch.arange(s, device=lengths.device) >= lengths.unsqueeze(-1)


def pads_only_the_end(pad: Tensor) -> bool:
    """Whether pad [b, s] (True = padded) pads each sequence only after its last real token
    (reads the mask: one synchronisation on an accelerator)."""
    return torch.equal(pad, padded_after(sequence_lengths(pad), pad.shape[1]))


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
               arbitrary: Optional[Tensor] = None, bottom_right_diagonal: Optional[bool] = None,
               trailing_padding: bool = True, cu_seqlens: Optional[Tuple[Tensor, Tensor]] = None) -> MaskSpec:
    """The mask for one attention call.

    attn_mask_type: canonical name; window: resolved (left, right) (check_set_window_size).
    bottom_right_diagonal: where the window's diagonal sits for the non-causal types
        (aligns_bottom_right); the causal types fix it themselves.
    pad_q [b, sq], pad_kv [b, skv]: bool, True = padded (used by the padding types only).
    arbitrary: bool, broadcastable to [b, h, sq, skv] (used by 'arbitrary' only).
    trailing_padding: whether the pads are known to pad only the ends of the sequences.
    cu_seqlens: the lengths those trailing pads were made from, if the caller has them
        (MaskSpec.cu_seqlens).
    A plain causal mask without padding or a narrower window is `causal` (no tensor).
    """
    padded = "padding" in attn_mask_type and (pad_q is not None or pad_kv is not None)
    bottom_right = aligns_bottom_right(attn_mask_type, bottom_right_diagonal)
    causal = "none"
    if attn_mask_type != "arbitrary" and not padded and window == (-1, 0) and is_causal(attn_mask_type):
        causal = "bottom_right" if bottom_right else "top_left"
    return MaskSpec(causal=causal, window=window, bottom_right=bottom_right, sq=sq, skv=skv,
                    pad_q=pad_q if padded else None, pad_kv=pad_kv if padded else None,
                    explicit=arbitrary if attn_mask_type == "arbitrary" else None,
                    trailing_padding=trailing_padding or not padded,
                    cu_seqlens=cu_seqlens if padded and trailing_padding else None, device=device)


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


def alibi_of(slopes: Tensor, spec: MaskSpec) -> Tensor:
    """ALiBi as a post-scale bias, fp32 [b | 1, h, sq, skv]: -slope * |query position - key|, the
    query positions aligned as spec's window (bottom-right per sequence when padded); slopes
    [h] or [b, h]."""
    offset = _offsets(spec.bottom_right, spec.sq, spec.skv, spec.pad_q, spec.pad_kv, slopes.device)
    query = torch.arange(spec.sq, device=slopes.device).view(spec.sq, 1) + offset
    distance = (query - torch.arange(spec.skv, device=slopes.device)).abs().float()  # [b | 1, 1 | -, sq, skv]
    return -slopes.float().view(-1, slopes.shape[-1], 1, 1) * distance
