"""te.MultiheadAttention: QKV projection, optional q/k normalisation and RoPE, core attention, output
projection, with TransformerEngine's arguments and parameter names.

    mha = MultiheadAttention(hidden_size=64, num_attention_heads=4, input_layernorm=True)
    y = mha(x)                            # x, y [s, b, 64] (qkv_format="sbhd")

Composed from te.Linear / te.LayerNormLinear (projections), te.DotProductAttention (attention),
te.RMSNorm / te.LayerNorm (q/k norm) and apply_rotary_pos_emb; no kernel code here.
"""
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from ..module import LayerNorm, LayerNormLinear, Linear, RMSNorm
from ..fp8.context import current_context
from ..module._tensor_parallel import divide, resolved_size
from ..ops.basic.l2normalization import L2Normalization
from ..utils import check_module_input
from . import context_parallel, fp8_attention, masks
from .dot_product_attention import DotProductAttention
from .rope import apply_rotary_pos_emb

QKV_FORMATS = ("sbhd", "bshd", "thd")
ATTENTION_TYPES = ("self", "cross")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
QK_NORM_TYPES = (None, "L2Normalization", "RMSNorm", "LayerNorm")


def _qk_norm_modules(qk_norm_type: Optional[str], head_dim: int, eps: float, device, params_dtype):
    """(q_norm, k_norm) per head over head_dim; L2Normalization has no parameters, so one instance
    serves both (as in TransformerEngine, where it adds no state_dict keys)."""
    if qk_norm_type is None:
        return None, None
    if qk_norm_type == "L2Normalization":
        l2 = L2Normalization(eps=eps)
        return l2, l2
    norm = RMSNorm if qk_norm_type == "RMSNorm" else LayerNorm
    return tuple(norm(head_dim, eps=eps, device=device, params_dtype=params_dtype) for _ in range(2))


def _sub(name: Optional[str], part: str) -> Optional[str]:
    """A submodule's name under its block's (TE's dotted names, which QuantizerRole.name carries)."""
    return None if name is None else f"{name}.{part}"


class MultiheadAttention(torch.nn.Module):
    """Multi-head (and grouped-query) self or cross attention, TransformerEngine 2.x's module.

    Args (TransformerEngine's names and defaults): hidden_size; num_attention_heads (np);
    kv_channels (head dim hn, default hidden_size // np); attention_dropout; layernorm_epsilon;
    init_method (QKV weights) / output_layer_init_method (proj weight), default normal(0, 0.023);
    layer_number; attn_mask_type / window_size / bottom_right_diagonal (defaults, overridable in
    forward; see te.DotProductAttention); softmax_type (te.DotProductAttention's attention sinks,
    its `core_attention.softmax_offset` parameter with 'learnable'); num_gqa_groups (ng,
    default np; must divide np); return_bias (return the proj bias instead of adding it);
    return_layernorm_output (with input_layernorm: also return the normalised input);
    input_layernorm (normalise the input inside the QKV projection); attention_type "self" | "cross";
    fuse_qkv_params (one fused QKV `weight` instead of `query_weight`/`key_weight`/`value_weight`);
    qkv_weight_interleaved (only with fuse_qkv_params; see below); zero_centered_gamma; bias;
    normalization "LayerNorm" | "RMSNorm"; device; params_dtype; qkv_format "sbhd" | "bshd" | "thd";
    qk_norm_type None | "L2Normalization" | "RMSNorm" | "LayerNorm" (per head on q and k, eps
    qk_norm_eps, after RoPE unless qk_norm_before_rope); rotary_pos_interleaved (rotate adjacent
    channel pairs). fuse_wgrad_accumulation, sequence_parallel, get_rng_state_tracker and tp_* go to
    the submodules; the userbuffers overlap flags ub_* are accepted and change nothing (as in
    te.Linear), seq_length and micro_batch_size are recorded (TE's JIT warm-up hints). Tensor
    parallelism (tp_size > 1 with set_parallel_mode=True): the heads and
    GQA groups are split over the ranks (whole groups per rank), the QKV projections are
    column-parallel and proj row-parallel; with sequence_parallel the input and output are this
    rank's shard of the sequence (sbhd's first dimension). Context parallelism:
    set_context_parallel_group (te.DotProductAttention's), RoPE rotating each rank's shard.

    Submodules (state_dict prefixes): self attention: `layernorm_qkv` (LayerNormLinear) with
    input_layernorm, else `qkv` (Linear); cross attention: `layernorm_query` (LayerNormLinear) or
    `query_layer` (Linear) on hidden_states and `key_value` (Linear) on encoder_output;
    `q_norm`/`k_norm` with qk_norm_type RMSNorm/LayerNorm; `core_attention` (DotProductAttention);
    `proj` (Linear).
    Fused QKV rows: with qkv_weight_interleaved=False [q (np*hn); k (ng*hn); v (ng*hn)]; with True one
    block per GQA group g: its np/ng query heads, then its key head, then its value head. Cross
    attention's fused key_value: per group [k_g; v_g] when interleaved, else [k; v].
    """

    def __init__(self, hidden_size: int, num_attention_heads: int, kv_channels: Optional[int] = None,
                 attention_dropout: float = 0.1, layernorm_epsilon: float = 1e-5,
                 init_method: Optional[Callable] = None, output_layer_init_method: Optional[Callable] = None,
                 layer_number: Optional[int] = None, attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, bottom_right_diagonal: Optional[bool] = None,
                 tp_group=None, tp_size: int = 1,
                 num_gqa_groups: Optional[int] = None, fuse_wgrad_accumulation: bool = False,
                 get_rng_state_tracker: Optional[Callable] = None, sequence_parallel: bool = False,
                 params_dtype: Optional[torch.dtype] = None, return_bias: bool = False,
                 return_layernorm_output: bool = False, input_layernorm: bool = False, attention_type: str = "self",
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False, zero_centered_gamma: bool = False,
                 qkv_weight_interleaved: bool = True, rotary_pos_interleaved: bool = False,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False, bias: bool = True,
                 normalization: str = "LayerNorm", device: Optional[Union[torch.device, str]] = None,
                 qkv_format: str = "sbhd", name: Optional[str] = None, qk_norm_type: Optional[str] = None,
                 qk_norm_eps: float = 1e-6, qk_norm_before_rope: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, softmax_type: str = "vanilla"):
        super().__init__()
        _check_arguments(hidden_size, num_attention_heads, kv_channels, num_gqa_groups, attention_type, qkv_format,
                         normalization, qk_norm_type, layer_number)
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups or num_attention_heads
        self.hidden_size_per_attention_head = kv_channels or hidden_size // num_attention_heads
        head_dim = self.hidden_size_per_attention_head
        self.hidden_size_q = head_dim * num_attention_heads
        self.hidden_size_kv = head_dim * self.num_gqa_groups
        # Tensor parallelism splits the heads (whole GQA groups) over the ranks: the QKV
        # projections are column-parallel, proj row-parallel (set_parallel_mode=True).
        self.tp_size = resolved_size(tp_group, tp_size)
        if self.tp_size > 1 and not set_parallel_mode:
            raise ValueError(f"MultiheadAttention: tp_size={self.tp_size} splits the heads over the ranks, which needs "
                             "set_parallel_mode=True (column-parallel QKV, row-parallel proj)")
        self.num_attention_heads_per_partition = divide("MultiheadAttention", "num_attention_heads",
                                                        num_attention_heads, self.tp_size)
        self.num_gqa_groups_per_partition = divide("MultiheadAttention", "num_gqa_groups", self.num_gqa_groups,
                                                   self.tp_size)
        self.attention_type, self.qkv_format, self.name = attention_type, qkv_format, name
        self.attn_mask_type, self.window_size = attn_mask_type, window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        self.layer_number = 1 if layer_number is None else layer_number
        self.input_layernorm, self.return_layernorm_output = input_layernorm, return_layernorm_output
        self.return_bias = return_bias
        self.normalization, self.layernorm_epsilon = normalization, layernorm_epsilon
        self.zero_centered_gamma = zero_centered_gamma
        # Separate q/k/v parameters are always stored [q; k; v]: interleaving only describes a fused weight.
        self.qkv_weight_interleaved = qkv_weight_interleaved and fuse_qkv_params
        self.rotary_pos_interleaved = rotary_pos_interleaved
        self.qk_norm_before_rope = qk_norm_before_rope
        params_dtype = params_dtype or torch.get_default_dtype()

        gemm = {"fuse_wgrad_accumulation": fuse_wgrad_accumulation, "tp_group": tp_group, "tp_size": tp_size,
                "sequence_parallel": sequence_parallel, "params_dtype": params_dtype, "device": device,
                "bias": bias, "init_method": init_method,
                "parallel_mode": "column" if set_parallel_mode else None}
        norm_gemm = {**gemm, "eps": layernorm_epsilon, "normalization": normalization,
                     "zero_centered_gamma": zero_centered_gamma, "return_layernorm_output": return_layernorm_output,
                     "get_rng_state_tracker": get_rng_state_tracker}
        if attention_type == "self":
            split = None if fuse_qkv_params else {"query": self.hidden_size_q, "key": self.hidden_size_kv,
                                                  "value": self.hidden_size_kv}
            qkv_size = self.hidden_size_q + 2 * self.hidden_size_kv
            if input_layernorm:
                self.layernorm_qkv = LayerNormLinear(hidden_size, qkv_size, parameters_split=split, **norm_gemm,
                                                     name=_sub(name, "layernorm_linear_qkv"))
            else:
                self.qkv = Linear(hidden_size, qkv_size, parameters_split=split, **gemm, name=_sub(name, "linear_qkv"))
        else:
            if input_layernorm:
                self.layernorm_query = LayerNormLinear(hidden_size, self.hidden_size_q,
                                                       parameters_split=None if fuse_qkv_params else ("query",),
                                                       **norm_gemm, name=_sub(name, "layernorm_linear_q"))
            else:  # TransformerEngine names this one `query_layer.weight` whether fused or not
                self.query_layer = Linear(hidden_size, self.hidden_size_q, **gemm, name=_sub(name, "linear_q"))
            self.key_value = Linear(hidden_size, 2 * self.hidden_size_kv,
                                    parameters_split=None if fuse_qkv_params else ("key", "value"), **gemm,
                                    name=_sub(name, "linear_kv"))
        self.q_norm, self.k_norm = _qk_norm_modules(qk_norm_type, head_dim, qk_norm_eps, device, params_dtype)
        self.core_attention = DotProductAttention(
            num_attention_heads, head_dim, num_gqa_groups=self.num_gqa_groups, attention_dropout=attention_dropout,
            qkv_format=qkv_format, attn_mask_type=attn_mask_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, softmax_type=softmax_type,
            sequence_parallel=sequence_parallel, tp_size=tp_size, get_rng_state_tracker=get_rng_state_tracker,
            tp_group=tp_group, layer_number=self.layer_number, attention_type=attention_type,
            name=_sub(name, "core_attention"))
        self.cp_size, self.cp_rank = 1, 0  # context parallelism: set_context_parallel_group
        self.proj = Linear(self.hidden_size_q, hidden_size, return_bias=return_bias,
                           **{**gemm, "init_method": output_layer_init_method,
                              "parallel_mode": "row" if set_parallel_mode else None}, name=_sub(name, "proj"))

    def forward(self, hidden_states: Tensor, attention_mask=None, encoder_output: Optional[Tensor] = None,
                attn_mask_type: Optional[str] = None, window_size: Optional[Tuple[int, int]] = None,
                bottom_right_diagonal: Optional[bool] = None,
                is_first_microbatch: Optional[bool] = None, checkpoint_core_attention: bool = False,
                inference_params=None, rotary_pos_emb: Union[Tensor, Tuple[Tensor, Tensor], None] = None,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Optional[Tensor] = None,
                alibi_slopes: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                cu_seqlens_kv: Optional[Tensor] = None, cu_seqlens_q_padded: Optional[Tensor] = None,
                cu_seqlens_kv_padded: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None, fast_zero_fill: bool = True,
                pad_between_seqs: Optional[bool] = None):
        """hidden_states: [s, b, hidden] (sbhd), [b, s, hidden] (bshd) or [t, hidden] (thd, with
        cu_seqlens_q/kv [b + 1], and cu_seqlens_*_padded where packed sequences have gaps);
        encoder_output (cross attention): keys/values source, same layout.
        attention_mask: True = masked out (see te.DotProductAttention). rotary_pos_emb: freqs
        [max_s, 1, 1, d_rot] (te.RotaryPositionEmbedding) for q and k, or a (q_freqs, k_freqs) pair;
        with pad_between_seqs=True RoPE counts positions from cu_seqlens_*_padded (TE's rule).
        Returns out [..., hidden]; (out, proj_bias) with return_bias; ln_out appended when
        input_layernorm and return_layernorm_output.
        """
        self._check_input("hidden_states", hidden_states)
        attn_mask_type = masks.canonical_mask_type(self.attn_mask_type if attn_mask_type is None else attn_mask_type)
        window_size = masks.check_set_window_size(attn_mask_type, self.window_size if window_size is None
                                                  else window_size)
        if bottom_right_diagonal is None:
            bottom_right_diagonal = self.bottom_right_diagonal

        fp8 = fp8_attention.handoffs(current_context(), rotary=rotary_pos_emb is not None)
        ln_out = None
        if self.attention_type == "self":
            mixed, ln_out = self._project(self.layernorm_qkv if self.input_layernorm else self.qkv, hidden_states,
                                          is_first_microbatch, fp8.qkv_output)
            query, key, value = self._split_qkv(mixed)
        else:
            if encoder_output is None:
                raise ValueError("MultiheadAttention: attention_type='cross' needs encoder_output")
            self._check_input("encoder_output", encoder_output)
            mixed_kv = self.key_value(encoder_output, is_first_microbatch=is_first_microbatch,
                                      fp8_output=fp8.qkv_output)
            key, value = self._split_kv(mixed_kv)
            query, ln_out = self._project(self.layernorm_query if self.input_layernorm else self.query_layer,
                                          hidden_states, is_first_microbatch, fp8.qkv_output)
            query = query.view(*query.shape[:-1], self.num_attention_heads_per_partition,
                               self.hidden_size_per_attention_head)

        if self.q_norm is not None and self.qk_norm_before_rope:
            query, key = self.q_norm(query), self.k_norm(key)
        if rotary_pos_emb is not None:
            q_freqs, k_freqs = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
            start_positions = None
            if inference_params is not None:  # each sequence's new tokens follow its cached ones
                start_positions = inference_params.get_seqlens_pre_step()[:inference_params.batch_size]
                if self.qkv_format == "thd":  # the new tokens, packed: the step's lengths as the cache counts them
                    cu_seqlens_q = inference_params.cu_seqlens_q[:inference_params.batch_size + 1]
                    cu_seqlens_kv = cu_seqlens_q
                else:
                    padded = query.shape[0 if self.qkv_format == "sbhd" else 1]
                    q_freqs, k_freqs = (_freqs_for_step(f, inference_params, padded) for f in (q_freqs, k_freqs))
            shard = {"cp_size": self.cp_size, "cp_rank": self.cp_rank}  # the angles of this rank's positions
            # Positions restart at each packed sequence's start; padded formats count them by row,
            # so the lengths (which TE's callers pass for those too) do not reach RoPE there.
            rope_cu_q, rope_cu_kv = ((cu_seqlens_q_padded, cu_seqlens_kv_padded) if pad_between_seqs
                                     else (cu_seqlens_q, cu_seqlens_kv))
            if self.qkv_format != "thd":
                rope_cu_q = rope_cu_kv = None
            query = apply_rotary_pos_emb(query, q_freqs, self.qkv_format, start_positions,
                                         interleaved=self.rotary_pos_interleaved, fused=True, cu_seqlens=rope_cu_q,
                                         **shard)
            key = apply_rotary_pos_emb(key, k_freqs, self.qkv_format, start_positions,
                                       interleaved=self.rotary_pos_interleaved, fused=True, cu_seqlens=rope_cu_kv,
                                       **shard)
        if self.q_norm is not None and not self.qk_norm_before_rope:
            query, key = self.q_norm(query), self.k_norm(key)

        context = self.core_attention(
            query, key, value, attention_mask=attention_mask, qkv_format=self.qkv_format, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=attn_mask_type, window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
            checkpoint_core_attention=checkpoint_core_attention,
            core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes, fast_zero_fill=fast_zero_fill, inference_params=inference_params,
            pad_between_seqs=pad_between_seqs, fp8_output=fp8.attention_output)  # [..., np * hn]
        out = self.proj(context, is_first_microbatch=is_first_microbatch, fp8_grad=fp8.proj_grad_input)
        outputs = out if self.return_bias else (out,)  # proj already returns (out, bias) with return_bias
        if self.input_layernorm and self.return_layernorm_output:
            outputs = (*outputs, ln_out)
        return outputs if len(outputs) > 1 else outputs[0]

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type: str = "p2p") -> None:
        """Context parallelism for the core attention (te.DotProductAttention's
        set_context_parallel_group); RoPE then rotates this rank's shard of the sequence by its
        positions' angles (cp_size, cp_rank: this rank's place in cp_group)."""
        self.core_attention.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        self.cp_size, self.cp_rank = context_parallel.size_and_rank(cp_group)

    def _check_input(self, name: str, tensor: Tensor) -> None:
        check_module_input("MultiheadAttention", name, tensor)
        rank = 2 if self.qkv_format == "thd" else 3
        if tensor.dim() != rank or tensor.shape[-1] != self.hidden_size:
            layout = "[t, hidden]" if rank == 2 else ("[s, b, hidden]" if self.qkv_format == "sbhd" else "[b, s, hidden]")
            raise ValueError(f"MultiheadAttention: {name} of shape {tuple(tensor.shape)} is not {layout} with "
                             f"hidden_size={self.hidden_size} (qkv_format={self.qkv_format!r})")

    def _project(self, module: torch.nn.Module, x: Tensor, is_first_microbatch,
                 fp8_output: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """The QKV (or query) projection's output (FP8 with fp8_output) and, from a LayerNormLinear
        asked for it, its norm output."""
        result = module(x, is_first_microbatch=is_first_microbatch, fp8_output=fp8_output)
        if self.input_layernorm and self.return_layernorm_output:
            return result
        return result, None

    def _split_qkv(self, mixed: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """[..., (np + 2 ng) * hn] -> q [..., np, hn], k and v [..., ng, hn], with this rank's
        np and ng (its heads and GQA groups; all of them on one rank)."""
        lead, hn = mixed.shape[:-1], self.hidden_size_per_attention_head
        heads, ng = self.num_attention_heads_per_partition, self.num_gqa_groups_per_partition
        if self.qkv_weight_interleaved:
            per_group = heads // ng
            grouped = mixed.view(*lead, ng, per_group + 2, hn)  # per group: its queries, its key, its value
            q, k, v = grouped.split((per_group, 1, 1), dim=-2)
            return q.reshape(*lead, heads, hn), k.squeeze(-2), v.squeeze(-2)
        q, k, v = mixed.split((heads * hn, ng * hn, ng * hn), dim=-1)
        return q.view(*lead, heads, hn), k.view(*lead, ng, hn), v.view(*lead, ng, hn)

    def _split_kv(self, mixed_kv: Tensor) -> Tuple[Tensor, Tensor]:
        """[..., 2 ng hn] -> k, v [..., ng, hn] (this rank's ng)."""
        lead, hn, ng = mixed_kv.shape[:-1], self.hidden_size_per_attention_head, self.num_gqa_groups_per_partition
        if self.qkv_weight_interleaved:
            k, v = mixed_kv.view(*lead, ng, 2 * hn).split(hn, dim=-1)  # per group: [k_g; v_g]
            return k, v
        k, v = mixed_kv.split(ng * hn, dim=-1)
        return k.view(*lead, ng, hn), v.view(*lead, ng, hn)


def _freqs_for_step(freqs: Tensor, params, padded: int) -> Tensor:
    """RoPE angles for a decoding step of bshd / sbhd inputs padded to `padded` tokens: every real
    token (positions below its sequence's total) must have its angle; the padding after a
    sequence's new tokens may run past freqs, and gets angle 0 there (its output is unused)."""
    longest = max(params.sequences.values(), default=0)
    if longest > freqs.shape[0]:
        raise ValueError(f"MultiheadAttention: rotary_pos_emb covers {freqs.shape[0]} positions, the KV cache's "
                         f"sequences reach {longest}")
    reach = max(params.sequences_pre_step.values(), default=0) + padded
    if reach <= freqs.shape[0]:
        return freqs
    return torch.cat([freqs, freqs.new_zeros(reach - freqs.shape[0], *freqs.shape[1:])])  # [reach, 1, 1, d]


def _check_arguments(hidden_size, num_attention_heads, kv_channels, num_gqa_groups, attention_type, qkv_format,
                     normalization, qk_norm_type, layer_number) -> None:
    if kv_channels is not None and (isinstance(kv_channels, bool) or not isinstance(kv_channels, int)
                                    or kv_channels <= 0):
        raise ValueError(f"MultiheadAttention: kv_channels must be a positive int, the head dim of queries, keys "
                         f"and values, got {kv_channels!r} (a (dk, dv) pair is te.DotProductAttention's, as in TE)")
    if hidden_size <= 0 or num_attention_heads <= 0:
        raise ValueError(f"MultiheadAttention: hidden_size={hidden_size} and num_attention_heads="
                         f"{num_attention_heads} must be positive")
    if kv_channels is None and hidden_size % num_attention_heads:
        raise ValueError(f"MultiheadAttention: hidden_size={hidden_size} is not divisible by num_attention_heads="
                         f"{num_attention_heads}; pass kv_channels (the head dim)")
    groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
    if groups <= 0 or num_attention_heads % groups:
        raise ValueError(f"MultiheadAttention: num_attention_heads={num_attention_heads} is not divisible by "
                         f"num_gqa_groups={num_gqa_groups}")
    for arg, value, allowed in (("attention_type", attention_type, ATTENTION_TYPES),
                                ("qkv_format", qkv_format, QKV_FORMATS),
                                ("normalization", normalization, NORMALIZATIONS),
                                ("qk_norm_type", qk_norm_type, QK_NORM_TYPES)):
        if value not in allowed:
            raise ValueError(f"MultiheadAttention: {arg}={value!r} is not one of {allowed}")
    if layer_number is not None and layer_number <= 0:
        raise ValueError(f"MultiheadAttention: layer_number={layer_number} must be a positive integer")
