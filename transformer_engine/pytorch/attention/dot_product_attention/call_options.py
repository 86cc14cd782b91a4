"""The TE 2.18 options of DotProductAttention that are checked, not computed, here: the softmax
type, the forward's backend hint num_splits and cuDNN-only callbacks
(score_mod*), and the one warning FP8 attention recipes get while attention runs in high
precision.
"""
import functools
import warnings
from typing import Callable, Dict, Optional

from torch import Tensor

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


def check_softmax_type(softmax_type: str) -> str:
    if softmax_type not in SOFTMAX_TYPES:
        raise ValueError(f"softmax_type must be one of {SOFTMAX_TYPES}, got {softmax_type!r}")
    return softmax_type


def check_score_mod(score_mod: Optional[Callable], score_mod_bprop: Optional[Callable],
                    score_mod_tensors: Optional[Dict[str, Tensor]],
                    score_mod_bprop_tensors: Optional[Dict[str, Tensor]]) -> None:
    """score_mod and its companions are callbacks into a cuDNN frontend graph, which no device
    of this package has: any of them set is refused by name."""
    given = [name for name, value in (("score_mod", score_mod), ("score_mod_bprop", score_mod_bprop),
                                      ("score_mod_tensors", score_mod_tensors),
                                      ("score_mod_bprop_tensors", score_mod_bprop_tensors)) if value is not None]
    if given:
        raise NotImplementedError(f"DotProductAttention: {', '.join(given)} (TE's experimental cuDNN frontend score "
                                  "modification) needs cuDNN's fused attention, which this package does not have; "
                                  "pass a core_attention_bias or an 'arbitrary' attention_mask instead")


def check_num_splits(num_splits: Optional[int]) -> None:
    """num_splits steers FlashAttention-3's kernel splitting; TE ignores it on every other
    backend, and so does this package, after checking it is a count."""
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"DotProductAttention: num_splits must be a positive int (or None), got {num_splits!r}")


def warn_fp8_attention_refused(reason: str) -> None:
    """A recipe asked for FP8 attention (fp8_dpa / fp8_mha) that this call cannot have:
    attention then runs in high precision (as TE does without those flags), said once per
    process and reason rather than passed over in silence."""
    _warn_fp8_attention(reason)


@functools.lru_cache(maxsize=None)  # once per process and reason
def _warn_fp8_attention(reason: str) -> None:
    warnings.warn(f"the FP8 recipe asks for FP8 attention (fp8_dpa / fp8_mha), but {reason}: DotProductAttention "
                  "runs its products and softmax in the input's high precision for such calls", UserWarning,
                  stacklevel=4)
