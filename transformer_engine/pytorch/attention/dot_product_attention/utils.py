"""TransformerEngine's attention-backend query (get_attention_backend and its AttentionParams),
answered for this package.

TE chooses among flash-attention, cuDNN's fused attention and its unfused PyTorch path. This
package has neither flash-attention nor cuDNN: DotProductAttention runs PyTorch's SDPA or
matmul + softmax (attention/backends), both of which TE's taxonomy calls "unfused". So the
answer is always (no flash, no fused, unfused), and the selection happens per call in
attention/backends/selection.py, not from the cache TE keeps in `_attention_backends` (which
TE code may still write: it is a plain dict here, read by nothing).
"""
import dataclasses
import logging
from typing import Any, List, Optional, Tuple

import torch

from ..masks import resolve_window

_attention_backends = {"attention_params": None, "use_flash_attention": None, "flash_attention_backend": None,
                       "use_fused_attention": None, "fused_attention_backend": None, "use_unfused_attention": None,
                       "backend_selection_requires_update": False}


@dataclasses.dataclass
class AttentionParams:
    """The attention call a backend is chosen for (TE's fields and defaults)."""
    qkv_type: Any = torch.Tensor
    qkv_dtype: torch.dtype = torch.bfloat16
    qkv_layout: str = "sbh3d"
    batch_size: int = 1
    num_heads: int = 16
    num_gqa_groups: int = 16
    max_seqlen_q: int = 128
    max_seqlen_kv: int = 128
    head_dim_qk: int = 64
    head_dim_v: int = 64
    attn_mask_type: str = "no_mask"
    window_size: Optional[Tuple[int, int]] = None
    alibi_slopes_shape: Any = None
    core_attention_bias_type: str = "no_bias"
    core_attention_bias_shape: Optional[str] = "1hss"
    core_attention_bias_requires_grad: bool = True
    pad_between_seqs: bool = False
    attention_dropout: float = 0.0
    context_parallel: bool = False
    cp_comm_type: str = "p2p"
    deterministic: bool = False
    is_training: bool = True
    fp8: bool = False
    fp8_meta: Any = None
    inference_params: Any = None
    softmax_type: str = "vanilla"
    return_max_logit: bool = False
    has_score_mod: bool = False
    has_score_mod_bprop: bool = False
    num_splits: int = 1


def get_attention_backend(attention_params: AttentionParams) -> Tuple[bool, None, bool, None, bool, List[bool]]:
    """(use_flash_attention, flash_attention_backend, use_fused_attention, fused_attention_backend,
    use_unfused_attention, [flash, fused, unfused] available): the unfused path, always."""
    if not isinstance(attention_params, AttentionParams):
        raise TypeError(f"get_attention_backend: attention_params must be an AttentionParams, got "
                        f"{type(attention_params).__name__}")
    return False, None, False, None, True, [False, False, True]


def check_set_window_size(attn_mask_type: str, window_size: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """window_size made to fit attn_mask_type: (-1, 0) / (-1, -1) when None; a causal mask's
    right bound forced to 0 with a warning."""
    return resolve_window(attn_mask_type, window_size)


class AttentionLogging:
    """TE's attention logger ("DotProductAttention"), set up once."""
    _is_logging_setup = False
    logger = logging.getLogger("DotProductAttention")

    @classmethod
    def setup_logging(cls) -> None:
        cls._is_logging_setup = True
