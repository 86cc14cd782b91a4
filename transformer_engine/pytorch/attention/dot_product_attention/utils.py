"""TransformerEngine's attention-backend query (get_attention_backend and its AttentionParams),
answered from this package's own backend selection.

TE chooses among the flash-attn package, cuDNN's fused attention and its unfused PyTorch path.
This package has neither flash-attn nor cuDNN: DotProductAttention runs our own kernel (the CPU
flash backend), PyTorch's SDPA or matmul + softmax (attention/backends), none of them a backend
TE code could configure through flash-attn's or cuDNN's options, so all are reported in TE's
"unfused" slot: flash and fused are never available, and unfused is available exactly when
DotProductAttention would run
the call: nothing the module refuses (FP8 attention, cuDNN score_mod callbacks, what context
parallelism does not run) and a backend whose supports() takes it. The reasons for a refusal go
to the "DotProductAttention" logger. TE's cache `_attention_backends` is a plain dict here, which
TE code may still write and nothing reads.
"""
import dataclasses
import logging
from typing import Any, List, Optional, Tuple

import torch
from torch.torch_version import TorchVersion

from ...utils import default_device
from .. import fp8_attention
from ..backends import AttentionConfig, selection
from ..masks import canonical_mask_type, check_set_window_size  # check_set_window_size: TE exports it here too

_attention_backends = {"attention_params": None, "use_flash_attention": None, "flash_attention_backend": None,
                       "use_fused_attention": None, "fused_attention_backend": None, "use_unfused_attention": None,
                       "backend_selection_requires_update": False}


class FlashAttentionUtils:
    """TE's record of the installed flash-attn package, which TE code and tests read (for
    instance whether flash-attn 3 or 4 is there). flash-attn is a CUDA package this one neither
    uses nor looks for: every version is absent, and our own flash kernel is reported among the
    unfused backends (get_attention_backend)."""
    is_installed = False
    version = TorchVersion("0")
    v2_plus = v2_1_plus = v2_3_plus = v2_4_plus = v2_4_1_plus = v2_5_plus = v2_5_7_plus = False
    v2_6_0_plus = v2_7_0_plus = False
    v3_is_installed = False
    fa3_version = TorchVersion("0")
    use_v3 = False
    v4_is_installed = False
    fa4_version = TorchVersion("0")
    use_v4 = False


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
    use_unfused_attention, [flash, fused, unfused] available) for the call attention_params
    describes. Only the unfused family exists here; it is refused with the reasons (logged at
    warning level) when no backend of this package runs the call."""
    if not isinstance(attention_params, AttentionParams):
        raise TypeError(f"get_attention_backend: attention_params must be an AttentionParams, got "
                        f"{type(attention_params).__name__}")
    reasons = unsupported_reasons(attention_params)
    if reasons:
        AttentionLogging.logger.warning("Disabling UnfusedDotProductAttention: %s", "; ".join(reasons))
    unfused = not reasons
    return False, None, False, None, unfused, [False, False, unfused]


def unsupported_reasons(params: AttentionParams) -> List[str]:
    """Why DotProductAttention would not run the call `params` describes; [] when it would."""
    reasons = []
    recipe = params.fp8_meta.get("recipe") if isinstance(params.fp8_meta, dict) else None
    if params.fp8 and recipe is not None and fp8_attention.asked(recipe):
        refused = fp8_attention.recipe_refusal(recipe)
        reasons += [refused] if refused else []
    if params.has_score_mod or params.has_score_mod_bprop:
        reasons.append("score_mod callbacks need cuDNN's fused attention")
    try:
        mask_type = canonical_mask_type(params.attn_mask_type)
    except ValueError as unknown:
        return reasons + [str(unknown)]
    if params.context_parallel:
        if params.softmax_type != "vanilla" or params.return_max_logit:
            reasons.append("context parallelism runs the vanilla softmax without max logits")
        if params.core_attention_bias_type != "no_bias":
            reasons.append("context parallelism runs without attention bias")
        if params.attention_dropout > 0 and params.cp_comm_type in ("p2p", "a2a+p2p") and params.is_training:
            reasons.append(f"cp_comm_type={params.cp_comm_type!r} runs without attention dropout")
    if params.qkv_layout.startswith("thd") and mask_type == "arbitrary":
        reasons.append("an 'arbitrary' mask does not apply to packed (thd) sequences")
    refusals = _backend_refusals(params, mask_type)
    if len(refusals) == len(selection.PREFERENCE):  # a call runs while one backend takes it
        reasons += [f"{backend.name}: {reason}" for backend, reason in refusals]
    return reasons


def _backend_refusals(params: AttentionParams, mask_type: str) -> List[Tuple[object, str]]:
    """(backend, reason) for each backend of the preference order that refuses the call."""
    window = check_set_window_size(mask_type) if params.window_size is None else tuple(params.window_size)
    structural = window in ((-1, 0), (-1, -1)) and mask_type in ("causal", "causal_bottom_right", "no_mask")
    config = AttentionConfig(
        dtype=params.qkv_dtype, device_type=default_device().type, num_heads=params.num_heads,
        num_gqa_groups=params.num_gqa_groups, head_dim_qk=params.head_dim_qk, head_dim_v=params.head_dim_v,
        causal=("none" if "causal" not in mask_type or not structural
                else "top_left" if mask_type == "causal" else "bottom_right"),
        has_mask=not structural, has_bias=params.core_attention_bias_type in ("pre_scale_bias", "post_scale_bias"),
        dropout=params.attention_dropout if params.is_training else 0.0,
        has_sink=params.softmax_type != "vanilla", has_alibi=params.core_attention_bias_type == "alibi",
        dense_mask=mask_type == "arbitrary")
    refusals = [(backend, backend.supports(config)) for backend in selection.PREFERENCE]
    return [(backend, reason) for backend, reason in refusals if reason is not None]


class AttentionLogging:
    """TE's attention logger ("DotProductAttention"), set up once."""
    _is_logging_setup = False
    logger = logging.getLogger("DotProductAttention")

    @classmethod
    def setup_logging(cls) -> None:
        cls._is_logging_setup = True
