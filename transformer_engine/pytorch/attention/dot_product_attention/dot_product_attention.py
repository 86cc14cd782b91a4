"""te.DotProductAttention: TransformerEngine's core attention, on declared backends.

    attn = DotProductAttention(num_attention_heads=16, kv_channels=64, num_gqa_groups=4)
    out = attn(q, k, v)    # q [s, b, 16, 64], k/v [s, b, 4, 64] -> out [s, b, 16 * 64]

The module validates the call, brings q/k/v to head-major [b, h, s, d] views, builds the mask
(masks.py) and bias, and runs the first backend (backends/selection.py) that supports the call;
`last_backend` names the one that ran. With a context-parallel group (set_context_parallel_group)
each rank holds a shard of the sequence and attention/context_parallel.py runs the call. Under
te.autocast with a per-tensor recipe that sets fp8_dpa (or fp8_mha), the call runs FP8 attention
(attention/fp8_attention.py) with the module's own FP8 state, TE's six attention slots, which its
`_extra_state` checkpoints; `last_backend` is then "fp8_flash".
"""
import contextlib
import dataclasses
import functools
import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..._autocast import autocast_disabled, autocast_input
from ...custom_ops.linear import gemm_dtype
from ...fp8.context import Fp8Context
from ...fp8.quantized_tensor import QuantizedTensor
from ...fp8.state import BACKWARD
from ...module._fp8_module import Fp8ModuleMixin
from ...module._tensor_parallel import divide, resolved_size
from ...parallel.collectives import group_rank
from ...utils import check_module_input, default_device
from .. import context_parallel, masks
from ..max_logit import max_logit
from .. import fp8_attention
from ..backends import AttentionBackend, AttentionProblem, describe, select_backend
from ..backends.flash import FlashBackend
from ..packing import PackedBatch, check_cu_seqlens, max_seqlen_of, pack_padded, packing, pad_packed
from ..paging import gather_pages
from . import call_options

QKV_FORMATS = ("sbhd", "bshd", "thd")


def _shape(t: Optional[Tensor]) -> Optional[Tuple[int, ...]]:
    return None if t is None else tuple(t.shape)


class DotProductAttention(Fp8ModuleMixin, torch.nn.Module):
    """out = softmax(q k^T * softmax_scale + bias, masked) @ v, per head, dropout on the probabilities.

    Args (TransformerEngine 2.x names and defaults):
        num_attention_heads: query heads h.
        kv_channels: head dim, or (dk, dv) when the value head dim differs from the query/key one.
        num_gqa_groups: key/value heads g (default h); must divide h. Query head i uses key/value
            head i // (h / g) (GQA; g = 1 is MQA).
        attention_dropout: dropout probability on the attention probabilities, training mode only.
        qkv_format: 'sbhd' [s, b, h, d], 'bshd' [b, s, h, d] or 'thd' [t, h, d] (packed sequences
            described by cu_seqlens_q / cu_seqlens_kv).
        attn_mask_type: 'no_mask', 'padding', 'causal', 'padding_causal' (or 'padding,causal'),
            'causal_bottom_right', 'padding_causal_bottom_right', 'arbitrary'. See masks.py for
            the alignment of each.
        window_size: (left, right) sliding window, made to fit the mask type by TE's
            check_set_window_size (masks.py): (-1, -1) none, (-1, 0) causal.
        bottom_right_diagonal: where the window's and ALiBi's diagonal sits for the non-causal
            mask types: bottom-right when None or True, top-left when False; the causal types
            fix it (masks.aligns_bottom_right).
        softmax_scale: default 1 / sqrt(dk).
        softmax_type: 'vanilla' softmax; 'off-by-one' adds a zero logit to every row's
            denominator; 'learnable' adds exp(softmax_offset[h]), softmax_offset an fp32
            parameter [heads of this rank] initialised to zeros (attention sinks, as gpt-oss).
        return_max_logit: forward also returns the per-head maximum of the masked, scaled and
            biased logits, fp32 [heads of this rank] (attention/max_logit.py).
        name: recorded.
        get_rng_state_tracker: callable returning an object whose fork() context manager the
            dropout runs under (Megatron's CUDA RNG tracker).
        tp_size / tp_group: tensor parallelism splits the heads and GQA groups over the group:
            this rank's layers carry num_attention_heads / tp_size query heads and
            num_gqa_groups / tp_size key/value heads (num_attention_heads_per_partition,
            num_gqa_groups_per_partition), and the default ALiBi slopes are its heads' slice.
        sequence_parallel, layer_number, attention_type ('self' | 'cross'): recorded.
        cp_group / cp_global_ranks / cp_stream / cp_comm_type: context parallelism, see
            set_context_parallel_group.
    Rows whose every key is masked (padded queries, a window or bottom-right mask leaving no key)
    output zeros and pass no gradient, in every backend and format.
    """

    fp8_forward_slots = fp8_attention.FORWARD_SLOTS  # TE's layout: three GEMMs' worth
    fp8_backward_slots = fp8_attention.BACKWARD_SLOTS

    def __init__(self, num_attention_heads: int, kv_channels: Union[int, Tuple[int, int]],
                 num_gqa_groups: Optional[int] = None, attention_dropout: float = 0.0, qkv_format: str = "sbhd",
                 attn_mask_type: str = "causal", window_size: Optional[Tuple[int, int]] = None,
                 bottom_right_diagonal: Optional[bool] = None, sequence_parallel: bool = False, tp_size: int = 1,
                 get_rng_state_tracker=None, tp_group=None,
                 layer_number: Optional[int] = None, attention_type: str = "self", cp_group=None,
                 cp_global_ranks=None, cp_stream=None, cp_comm_type: str = "p2p",
                 softmax_scale: Optional[float] = None, softmax_type: str = "vanilla", return_max_logit: bool = False,
                 name: Optional[str] = None):
        super().__init__()
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads <= 0 or num_gqa_groups <= 0 or num_attention_heads % num_gqa_groups:
            raise ValueError(f"num_gqa_groups ({num_gqa_groups}) must divide num_attention_heads "
                             f"({num_attention_heads}), both positive")
        dk, dv = (kv_channels, kv_channels) if isinstance(kv_channels, int) else tuple(kv_channels)
        if dk <= 0 or dv <= 0:
            raise ValueError(f"kv_channels must be positive, got {kv_channels!r}")
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout}")
        if attention_type not in ("self", "cross"):
            raise ValueError(f"attention_type must be 'self' or 'cross', got {attention_type!r}")
        self.attn_mask_type = masks.canonical_mask_type(attn_mask_type)
        self.window_size = masks.check_set_window_size(self.attn_mask_type, window_size)
        self.bottom_right_diagonal = bottom_right_diagonal
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups
        self.tp_size = resolved_size(tp_group, tp_size)
        self.num_attention_heads_per_partition = divide("DotProductAttention", "num_attention_heads",
                                                        num_attention_heads, self.tp_size)
        self.num_gqa_groups_per_partition = divide("DotProductAttention", "num_gqa_groups", num_gqa_groups,
                                                   self.tp_size)
        self.hidden_size_per_attention_head_k = dk
        self.hidden_size_per_attention_head_v = dv
        self.attention_dropout = attention_dropout
        self.qkv_format = qkv_format
        self.softmax_scale = 1.0 / math.sqrt(dk) if softmax_scale is None else softmax_scale
        self.sequence_parallel = sequence_parallel
        self.tp_group = tp_group
        self.get_rng_state_tracker = get_rng_state_tracker
        self.layer_number = layer_number
        self.attention_type = attention_type
        self.name = name
        self.softmax_type = call_options.check_softmax_type(softmax_type)
        self.return_max_logit = return_max_logit
        # TE's attribute for every softmax_type: None for 'vanilla'; for 'off-by-one' a plain fp32
        # tensor of zeros (no parameter, not in the state dict), whose gradient a caller may ask
        # for with requires_grad; for 'learnable' a parameter.
        self.softmax_offset: Optional[Tensor] = None
        if softmax_type != "vanilla":
            zeros = torch.zeros(self.num_attention_heads_per_partition, dtype=torch.float32, device=default_device())
            self.softmax_offset = torch.nn.Parameter(zeros) if softmax_type == "learnable" else zeros
        self.last_backend: Optional[str] = None
        self.fp8_meta = None  # TE's six FP8 attention slots, made by the first FP8 attention call

    def set_context_parallel_group(self, cp_group, cp_global_ranks: Optional[Sequence[int]], cp_stream,
                                   cp_comm_type: str = "p2p") -> None:
        """Context parallelism (attention/context_parallel.py): each rank holds a shard of the
        sequence, sequences cut into 2 cp chunks of which rank r holds chunks r and 2 cp - 1 - r.

        cp_group: a ProcessGroup, or [a2a group, p2p group] for cp_comm_type 'a2a+p2p'; None or
            a one-rank group turns it off. cp_comm_type: 'p2p' (K/V round a ring), 'all_gather'
            (K/V gathered), 'a2a' (sequence shards traded for head shards), 'a2a+p2p'.
        cp_global_ranks and cp_stream are recorded: the collectives address the group's ranks,
            and run asynchronously on the device's own stream.
        """
        context_parallel.check_group(cp_group, cp_comm_type)
        self.cp_group, self.cp_global_ranks, self.cp_stream = cp_group, cp_global_ranks, cp_stream
        self.cp_comm_type = cp_comm_type

    def forward(self, query_layer: Tensor, key_layer: Tensor, value_layer: Tensor,
                attention_mask: Union[Tensor, Tuple[Tensor, Tensor], None] = None, qkv_format: Optional[str] = None,
                cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_kv: Optional[Tensor] = None,
                cu_seqlens_q_padded: Optional[Tensor] = None, cu_seqlens_kv_padded: Optional[Tensor] = None,
                max_seqlen_q: Optional[int] = None, max_seqlen_kv: Optional[int] = None,
                attn_mask_type: Optional[str] = None, window_size: Optional[Tuple[int, int]] = None,
                bottom_right_diagonal: Optional[bool] = None, checkpoint_core_attention: bool = False,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Optional[Tensor] = None,
                alibi_slopes: Optional[Tensor] = None, fast_zero_fill: bool = True, inference_params=None,
                pad_between_seqs: Optional[bool] = None, fp8_output: Optional[bool] = False,
                num_splits: Optional[int] = 1, score_mod: Optional[Callable] = None,
                score_mod_bprop: Optional[Callable] = None, score_mod_tensors: Optional[Dict[str, Tensor]] = None,
                score_mod_bprop_tensors: Optional[Dict[str, Tensor]] = None
                ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Attention of query_layer over key_layer / value_layer.

        query_layer [sq, b, h, dk] (sbhd), [b, sq, h, dk] (bshd) or [tq, h, dk] (thd);
        key_layer / value_layer likewise with skv and g heads, dk / dv channels.
        attention_mask (bool, True = masked out): for padding types [b, 1, 1, s] (self
            attention) or a pair ([b, 1, 1, sq], [b, 1, 1, skv]); for 'arbitrary' anything
            broadcastable to [b, h, sq, skv]; ignored by the other types, as in TE. For sbhd/bshd
            padding types without a mask, cu_seqlens_q/kv [b + 1] give the lengths.
        cu_seqlens_q / cu_seqlens_kv: int32 [b + 1] cumulative lengths (required for thd);
            cu_seqlens_*_padded: where each packed sequence starts when sequences are padded;
            max_seqlen_*: the longest sequence (computed when None, which synchronises).
        attn_mask_type, window_size, bottom_right_diagonal, qkv_format: override the
            constructor's for this call (window_size checked against the call's mask type).
        core_attention_bias_type: 'no_bias', 'pre_scale_bias' (softmax(scale * (q k^T + bias))),
            'post_scale_bias' (softmax(scale * q k^T + bias)) with core_attention_bias float
            [1 or b, 1 or h, 1 or sq, skv]; 'alibi' with alibi_slopes fp32 [h] or [b, h] (default: the
            ALiBi paper's slopes), bias -slope * |query position - key position|.
        checkpoint_core_attention: recompute the attention in backward instead of saving it.
        fast_zero_fill: accepted for compatibility; thd tokens outside every sequence are always zero.
        pad_between_seqs: TE's hint that thd sequences have gaps between them. As in TE, the
            gaps are where cu_seqlens_*_padded puts them, whatever the hint; without them each
            sequence starts at its cu_seqlens entry (no gaps).
        fp8_output: under FP8 attention, return O as the FP8 tensor of the O slot's cast (a
            Float8Tensor, read by te.Linear as its codes), as TE does; else O's values in the
            input's dtype. Ignored where attention runs in high precision. query_layer, key_layer
            and value_layer may be FP8 tensors (fp8_mha: the QKV projection's fp8_output): FP8
            attention reads their codes as they are and, when all three are, returns their
            gradients as FP8 tensors; any other backend reads their values.
        num_splits: FlashAttention-3's split count; ignored, as TE ignores it on other backends.
        score_mod, score_mod_bprop, score_mod_tensors, score_mod_bprop_tensors: cuDNN-only
            callbacks, refused (NotImplementedError) when given.
        Under context parallelism the layers are this rank's shard of the sequence (see
        set_context_parallel_group), cu_seqlens_* the global ones, and the output its shard.
        Returns [sq, b, h * dv] (sbhd), [b, sq, h * dv] (bshd) or [tq, h * dv] (thd), and with
        return_max_logit the pair (that, max_logit fp32 [h]).
        """
        call_options.check_score_mod(score_mod, score_mod_bprop, score_mod_tensors, score_mod_bprop_tensors)
        call_options.check_num_splits(num_splits)
        fp8 = self._fp8_context()
        if fp8 is not None and not (fp8.enabled and fp8_attention.asked(fp8.recipe)):
            fp8 = None  # attention in high precision, as TE runs it without fp8_dpa
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in QKV_FORMATS:
            raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {fmt!r}")
        mask_type = self.attn_mask_type if attn_mask_type is None else masks.canonical_mask_type(attn_mask_type)
        window = masks.check_set_window_size(mask_type, self.window_size if window_size is None else window_size)
        if bottom_right_diagonal is None:
            bottom_right_diagonal = self.bottom_right_diagonal
        if fp8 is not None and (inference_params is not None or context_parallel.size_and_rank(self.cp_group)[0] > 1):
            call_options.warn_fp8_attention_refused("FP8 attention does not run over a KV cache or under context "
                                                    "parallelism yet")
            fp8 = None
        if fp8 is None:  # FP8 q, k, v (fp8_mha's projections) in high precision, as TE's F16 backends take them
            query_layer, key_layer, value_layer = (_values(t) for t in (query_layer, key_layer, value_layer))
        if context_parallel.size_and_rank(self.cp_group)[0] > 1:
            return self._attend_context_parallel(
                query_layer, key_layer, value_layer, fmt, mask_type, window, bottom_right_diagonal, cu_seqlens_q,
                cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, checkpoint_core_attention,
                core_attention_bias_type, inference_params)
        if inference_params is not None:
            return self._attend_over_kv_cache(
                inference_params, query_layer, key_layer, value_layer, fmt, mask_type, window_size=window,
                bottom_right_diagonal=bottom_right_diagonal,
                checkpoint_core_attention=checkpoint_core_attention, core_attention_bias_type=core_attention_bias_type,
                core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes)
        if fmt == "thd":
            mask_type = masks.thd_mask_type(mask_type)
        self._check_layers(query_layer, key_layer, value_layer, fmt)

        if fmt == "thd":
            if cu_seqlens_q is None or cu_seqlens_kv is None:
                raise ValueError("qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv (int32 [b + 1]), got "
                                 f"cu_seqlens_q {_shape(cu_seqlens_q)}, cu_seqlens_kv {_shape(cu_seqlens_kv)}")
            if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape != cu_seqlens_kv.shape:
                raise ValueError(f"cu_seqlens_q {_shape(cu_seqlens_q)} and cu_seqlens_kv {_shape(cu_seqlens_kv)} "
                                 "must both be [b + 1]")
            self._check_packing("q", cu_seqlens_q, cu_seqlens_q_padded, query_layer.shape[0])
            self._check_packing("kv", cu_seqlens_kv, cu_seqlens_kv_padded, key_layer.shape[0])
            sq = max_seqlen_of(cu_seqlens_q) if max_seqlen_q is None else int(max_seqlen_q)
            skv = max_seqlen_of(cu_seqlens_kv) if max_seqlen_kv is None else int(max_seqlen_kv)
            packed = PackedBatch(cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                                 packing(cu_seqlens_q, cu_seqlens_q_padded, sq, query_layer.shape[0]),
                                 packing(cu_seqlens_kv, cu_seqlens_kv_padded, skv, key_layer.shape[0]))
            q, k, v = query_layer, key_layer, value_layer  # [t, h, d]: _attend pads them where the backend asks
            b, pad_q, pad_kv = cu_seqlens_q.shape[0] - 1, packed.q.pad, packed.kv.pad
        else:
            # sbhd [s, b, h, d] -> [b, h, s, d]; bshd [b, s, h, d] -> [b, h, s, d] (views)
            order = (1, 2, 0, 3) if fmt == "sbhd" else (0, 2, 1, 3)
            q, k, v = (t.permute(order) for t in (query_layer, key_layer, value_layer))
            b, sq, skv, packed = q.shape[0], q.shape[2], k.shape[2], None
            pad_q, pad_kv = self._padding(attention_mask, mask_type, b, sq, skv, cu_seqlens_q, cu_seqlens_kv)

        arbitrary = self._arbitrary_mask(attention_mask, b, sq, skv) if mask_type == "arbitrary" else None
        problem = self._problem(mask_type, window, bottom_right_diagonal, b, sq, skv, q.device, pad_q, pad_kv,
                                arbitrary, _trailing(fmt, attention_mask, pad_q, pad_kv), core_attention_bias_type,
                                core_attention_bias, alibi_slopes)
        problem = dataclasses.replace(problem, packed=packed)
        out, logit = self._attend(q, k, v, problem, checkpoint_core_attention, fp8,
                                  fp8_output)  # [b, h, sq, dv], thd [t, h, dv]; FP8 with fp8_output

        h, dv = out.shape[1], out.shape[-1]
        if fmt == "sbhd":
            out = out.permute(2, 0, 1, 3).reshape(sq, b, h * dv)
        elif fmt == "bshd":
            out = out.transpose(1, 2).reshape(b, sq, h * dv)
        else:
            out = out.reshape(-1, h * dv)  # [t, h, dv] -> [t, h * dv]
        return out if logit is None else (out, logit)

    def _problem(self, mask_type: str, window: Tuple[int, int], bottom_right_diagonal: Optional[bool], b: int, sq: int,
                 skv: int, device: torch.device, pad_q: Optional[Tensor], pad_kv: Optional[Tensor],
                 arbitrary: Optional[Tensor], trailing_padding: bool, bias_type: str, bias: Optional[Tensor],
                 alibi_slopes: Optional[Tensor], page_table: Optional[Tensor] = None,
                 cu_seqlens: Optional[Tuple[Tensor, Tensor]] = None) -> AttentionProblem:
        """The call's mask, bias, ALiBi slopes, sink, dropout and paged cache as one AttentionProblem
        over scores [b, h, sq, skv]; cu_seqlens: the lengths the pads were made from, where known
        as numbers (MaskSpec.cu_seqlens)."""
        if bias_type not in masks.BIAS_TYPES:
            raise ValueError(f"core_attention_bias_type must be one of {masks.BIAS_TYPES}, got {bias_type!r}")
        spec = masks.build_mask(mask_type, window, sq, skv, device, pad_q, pad_kv, arbitrary,
                                bottom_right_diagonal=bottom_right_diagonal, trailing_padding=trailing_padding,
                                cu_seqlens=cu_seqlens)
        bias, slopes = self._bias(bias_type, bias, alibi_slopes, b, sq, skv, device)
        return AttentionProblem(spec=spec, bias=bias, scale=self.softmax_scale,
                                dropout=self.attention_dropout if self.training else 0.0,
                                softmax_offset=self._softmax_offset(device), alibi_slopes=slopes,
                                page_table=page_table)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem, checkpoint_core_attention: bool,
                fp8: Optional[Fp8Context] = None, fp8_output: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """q [b, h, sq, dk], k / v [b, g, skv, d] (or a paged cache's pools with problem.page_table,
        or a thd call's packed [t, h | g, d] with problem.packed) -> (out [b, h, sq, dv] in q's
        dtype (packed: [t, h, dv]), the per-head max logit fp32 [h] with return_max_logit, else
        None), on the first backend that supports the call; FP8 attention under `fp8`, the
        autocast region whose recipe asks for it, where it takes the call (q, k, v may then be
        FP8 tensors, and with fp8_output out is one)."""
        if fp8 is not None:
            refusal = fp8_attention.refusal(fp8.recipe, problem)
            if refusal is None:
                return self._attend_fp8(*(_autocast_unless_fp8(t) for t in (q, k, v)), problem, fp8, fp8_output)
            call_options.warn_fp8_attention_refused(refusal)
        q, k, v = (autocast_input(_values(t)) for t in (q, k, v))
        out_dtype = q.dtype
        backend = self._select_backend(q, k, v, problem)
        packed = problem.packed
        if packed is not None and not backend.reads_packed(problem):
            # [t, h, d] -> [b, s_max, h, d] -> [b, h, s_max, d]
            q = pad_packed(q, packed.q).transpose(1, 2)
            k, v = (pad_packed(t, packed.kv).transpose(1, 2) for t in (k, v))
            problem = dataclasses.replace(problem, packed=None)
        if problem.page_table is not None:
            wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            if not backend.reads_pages(problem, wants_grad):
                # pools -> [b, skv, g, d] -> [b, g, skv, d]
                k, v = (gather_pages(t, problem.page_table, problem.spec.skv).transpose(1, 2) for t in (k, v))
                problem = dataclasses.replace(problem, page_table=None)
        if not backend.reads_16bit:
            q, k, v = self._compute_inputs(q, k, v)
        with autocast_disabled(q.device):
            out, logit = self._run_backend(backend, q, k, v, problem, checkpoint_core_attention)
            if self.return_max_logit and logit is None:  # the backend does not have it: the scores again
                logit = max_logit(q, k, problem)  # [h]
        if packed is not None and problem.packed is None:
            out = pack_padded(out.transpose(1, 2), packed.q)  # [b, h, sq, dv] -> [t, h, dv]
        return out.to(out_dtype), logit

    def _attend_fp8(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem,
                    fp8: Fp8Context, fp8_output: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """_attend in FP8 (fp8_attention.py), with the module's FP8 state for the region's
        recipe: its forward update scheduled for the region's exit, its backward one run by
        the backward. FP8 q, k, v are read as their codes; fp8_output returns O's FP8 tensor."""
        meta = self._meta_for(fp8_attention.state_recipe(fp8.recipe), q.device)
        self._record_fp8_forward(meta)
        quantizers = fp8_attention.slot_quantizers(fp8.recipe, meta)
        packed = problem.packed
        if packed is not None and not FlashBackend().reads_packed(problem):
            # [t, h, d] -> [b, s_max, h, d] -> [b, h, s_max, d]
            q = pad_packed(q, packed.q).transpose(1, 2)
            k, v = (pad_packed(t, packed.kv).transpose(1, 2) for t in (k, v))
            problem = dataclasses.replace(problem, packed=None)
        if not torch.compiler.is_compiling():
            self.last_backend = "fp8_flash"
        with autocast_disabled(q.device), self._dropout_rng(problem):
            out = fp8_attention.fp8_attention(q, k, v, problem, quantizers,
                                              lambda: meta.update(BACKWARD, fp8.amax_reduction_group), fp8_output)
            logit = max_logit(q, k, problem) if self.return_max_logit else None  # [h]
        if packed is not None and problem.packed is None:
            out = pack_padded(out.transpose(1, 2), packed.q)  # [b, h, sq, dv] -> [t, h, dv]
        return out, logit

    def _dropout_rng(self, problem: AttentionProblem):
        """Where dropout draws: get_rng_state_tracker's fork when one is given and it drops."""
        if problem.dropout > 0 and self.get_rng_state_tracker is not None:
            return self.get_rng_state_tracker().fork()
        return contextlib.nullcontext()

    def _softmax_offset(self, device: torch.device) -> Optional[Tensor]:
        """The attention sink's logits [heads of this rank] for softmax_type, None for 'vanilla':
        fp32 on `device` even when the module was cast (.to(bf16)), since the backends add it
        to fp32 logits; both casts pass the gradient back."""
        if self.softmax_offset is None:
            return None
        return self.softmax_offset.to(device=device, dtype=torch.float32)

    @staticmethod
    def _compute_inputs(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """q, k, v in the dtype the attention products run in, for a backend that multiplies them
        as they come (not reads_16bit).

        The attention products follow the GEMM policy of the Linear modules: on a CPU without
        bf16 matrix hardware 16-bit q/k/v are widened to fp32 (measured here: a causal
        [4, 16, 512, 64] SDPA forward + backward 4x faster), and the output rounded back.
        Inside torch.autocast the products run in its dtype (autocast_input, widened as above),
        as the Linear modules' do; the attention then runs with autocast off so the widening
        stands."""
        compute = gemm_dtype(q.device, q.dtype)
        return q.to(compute), k.to(compute), v.to(compute)

    def _select_backend(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem) -> AttentionBackend:
        """The first backend that supports the call (backends/selection.py); last_backend names it."""
        backend = select_backend(describe(q, k, v, problem))
        if not torch.compiler.is_compiling():
            self.last_backend = backend.name
        return backend

    def _run_backend(self, backend: AttentionBackend, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem,
                     checkpoint_core_attention: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """q [b, h, sq, dk], k / v [b, g, skv, d] -> (out [b, h, sq, dv], with return_max_logit the
        per-head max logit when the backend has it, else None); dropout under
        get_rng_state_tracker's fork when one is given."""
        with self._dropout_rng(problem):
            if checkpoint_core_attention:
                return torch.utils.checkpoint.checkpoint(backend.run, q, k, v, problem, self.return_max_logit,
                                                         use_reentrant=False)
            return backend.run(q, k, v, problem, self.return_max_logit)

    def _attend_chunk(self, q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem,
                      checkpoint_core_attention: bool) -> Tensor:
        """One chunk of context-parallel attention (q, k, v already in the compute dtype)."""
        return self._run_backend(self._select_backend(q, k, v, problem), q, k, v, problem,
                                 checkpoint_core_attention)[0]

    def _attend_context_parallel(self, query: Tensor, key: Tensor, value: Tensor, fmt: str, mask_type: str,
                                 window: Tuple[int, int], bottom_right_diagonal: Optional[bool],
                                 cu_seqlens_q: Optional[Tensor],
                                 cu_seqlens_kv: Optional[Tensor], cu_seqlens_q_padded: Optional[Tensor],
                                 cu_seqlens_kv_padded: Optional[Tensor], checkpoint_core_attention: bool,
                                 core_attention_bias_type: str, inference_params) -> Tensor:
        """forward() with the sequence split over cp_group (attention/context_parallel.py).
        last_backend is the backend the gathered attention ran on, or 'cp_ring' for the p2p
        ring (attention/ring_attention.py: each block on the flash kernel on the CPU, on matmuls
        elsewhere), which keeps no attention probabilities for backward:
        checkpoint_core_attention applies to the backends' calls."""
        if inference_params is not None:
            raise NotImplementedError("DotProductAttention: KV caching (inference_params) does not run with context "
                                      "parallelism (cp_group)")
        if core_attention_bias_type != "no_bias":
            raise NotImplementedError("DotProductAttention: context parallelism (cp_group) runs without attention "
                                      f"bias, got core_attention_bias_type={core_attention_bias_type!r}")
        if self.softmax_type != "vanilla" or self.return_max_logit:
            raise NotImplementedError("DotProductAttention: context parallelism (cp_group) runs the vanilla softmax "
                                      f"without max logits, got softmax_type={self.softmax_type!r}, "
                                      f"return_max_logit={self.return_max_logit}")
        if fmt == "thd":
            mask_type = masks.thd_mask_type(mask_type)
        self._check_layers(query, key, value, fmt)
        q, k, v = (autocast_input(t) for t in (query, key, value))
        out_dtype = q.dtype
        q, k, v = self._compute_inputs(q, k, v)
        if not torch.compiler.is_compiling():
            self.last_backend = "cp_ring"
        with autocast_disabled(q.device):
            out = context_parallel.attention(
                q, k, v, cp_group=self.cp_group, cp_comm_type=self.cp_comm_type, qkv_format=fmt,
                attn_mask_type=mask_type, window=window,
                bottom_right=masks.aligns_bottom_right(mask_type, bottom_right_diagonal),
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
                scale=self.softmax_scale, dropout=self.attention_dropout if self.training else 0.0,
                attend=functools.partial(self._attend_chunk, checkpoint_core_attention=checkpoint_core_attention))
        return out.to(out_dtype)

    def _attend_over_kv_cache(self, params, query: Tensor, key: Tensor, value: Tensor, fmt: str, mask_type: str,
                              window_size: Tuple[int, int], bottom_right_diagonal: Optional[bool],
                              checkpoint_core_attention: bool, core_attention_bias_type: str,
                              core_attention_bias: Optional[Tensor], alibi_slopes: Optional[Tensor]
                              ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Incremental decoding (TE's inference_params, attention/inference.py): this step's keys
        and values go into the layer's cache, and the step's queries attend over every cached
        token of their sequence. The lengths are the cache's (cu_seqlens_q: this step's tokens,
        cu_seqlens_kv: all of them); a causal mask aligns bottom right, the new tokens coming
        after the cached ones. A paged cache goes in as its pools and page table, which the flash
        kernel reads in place (_attend gathers the pages for a backend or call it cannot). The
        output has the query's format."""
        if self.layer_number is None:
            raise ValueError("DotProductAttention: inference_params needs layer_number, which names the layer's "
                             "KV cache")
        if "padding" not in mask_type:
            raise ValueError("DotProductAttention: KV caching (inference_params) needs a padding mask type "
                             f"('padding' or 'padding_causal'), got attn_mask_type={mask_type!r}")
        if mask_type == "padding_causal":
            mask_type = "padding_causal_bottom_right"
        self._check_layers(query, key, value, fmt)
        if key.dtype != params.dtype:
            raise ValueError(f"DotProductAttention: key/value dtype {key.dtype} differs from the KV cache's "
                             f"(InferenceParams dtype={params.dtype})")
        k_cache, v_cache, cu_seqlens_q, cu_seqlens_kv, _, _ = params.step(self.layer_number, key, value, fmt)
        batch, longest = params.batch_size, max(params.sequences.values(), default=0)
        cu_seqlens_q, cu_seqlens_kv = cu_seqlens_q[:batch + 1], cu_seqlens_kv[:batch + 1]
        packed_q = None
        if fmt == "thd":
            packed_q = packing(cu_seqlens_q, None, max(params.step_lengths, default=0), query.shape[0])
            q = pad_packed(query, packed_q)  # [t, h, d] -> [b, sq, h, d]
        else:
            q = query if fmt == "bshd" else query.transpose(0, 1)  # [sq, b, h, d] -> [b, sq, h, d]
        # A batch kept at max_batch_size (TE's CUDA-graph steps): the rows past the step's
        # sequences are padding; they attend to nothing and come out zero.
        padding_rows = q.shape[0] - batch
        if padding_rows:
            q = q[:batch]
        b, sq = q.shape[0], q.shape[1]
        page_table = None
        if params.is_paged:  # the pools [pages, page_size, g, d], read through the page table
            k, v, page_table = k_cache, v_cache, params.cache_manager.page_table[:batch]
        else:
            k, v = (t.transpose(1, 2) for t in params.cached(self.layer_number, longest))  # [b, g, longest, d]
        # The step's lengths as numbers: no query row is padded when every sequence brings sq
        # tokens (decoding one token each), and the flash kernel takes the lengths themselves.
        step_lengths, cached_lengths = params.step_lengths[:b], list(params.sequences.values())[:b]
        pad_q = None
        if any(n != sq for n in step_lengths):
            pad_q = _pad_from_lengths(cu_seqlens_q, sq, "cu_seqlens_q", b)
        pad_kv = _pad_from_lengths(cu_seqlens_kv, longest, "cu_seqlens_kv", b)
        lengths = (_cumulative_cpu(step_lengths), _cumulative_cpu(cached_lengths))
        problem = self._problem(mask_type, masks.check_set_window_size(mask_type, window_size), bottom_right_diagonal,
                                b, sq, longest, q.device, pad_q, pad_kv, None, True, core_attention_bias_type,
                                core_attention_bias, alibi_slopes, page_table, cu_seqlens=lengths)
        out, logit = self._attend(q.transpose(1, 2), k, v, problem, checkpoint_core_attention)
        out = out.transpose(1, 2).reshape(b, sq, -1)  # [b, h, sq, dv] -> [b, sq, h * dv]
        if padding_rows > 0:
            out = torch.cat([out, out.new_zeros(padding_rows, sq, out.shape[-1])])
        if fmt == "sbhd":
            out = out.transpose(0, 1).contiguous()  # [sq, b, h * dv]
        elif fmt == "thd":
            out = pack_padded(out, packed_q)  # [b, sq, h * dv] -> [t, h * dv]
        return out if logit is None else (out, logit)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # TE 1.6 kept the FP8 attention state in a submodule's `fused_attention._extra_state`;
        # TE loads it as the module's own, and so does this package.
        legacy = state_dict.pop(prefix + "fused_attention._extra_state", None)
        if legacy is not None:
            state_dict.setdefault(prefix + "_extra_state", legacy)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def _check_packing(side: str, cu_seqlens: Tensor, cu_seqlens_padded: Optional[Tensor], tokens: int) -> None:
        """cu_seqlens_{side} (and cu_seqlens_{side}_padded) against the packed tensor's `tokens`:
        tokens past the last sequence are allowed (they come out zero), tokens past the end are not,
        and each sequence must fit in its padded slot."""
        check_cu_seqlens(f"cu_seqlens_{side}", cu_seqlens, tokens, covers_all_tokens=False)
        if cu_seqlens_padded is None:
            return
        check_cu_seqlens(f"cu_seqlens_{side}_padded", cu_seqlens_padded, tokens, covers_all_tokens=False)
        if cu_seqlens_padded.shape != cu_seqlens.shape:
            raise ValueError(f"cu_seqlens_{side}_padded {_shape(cu_seqlens_padded)} must have the shape of "
                             f"cu_seqlens_{side} {_shape(cu_seqlens)}")
        if torch.compiler.is_compiling():
            return
        lengths, slots = cu_seqlens.diff().tolist(), cu_seqlens_padded.diff().tolist()
        if any(n > slot for n, slot in zip(lengths, slots)):
            raise ValueError(f"the sequence lengths {lengths} of cu_seqlens_{side} must fit in the slots {slots} "
                             f"of cu_seqlens_{side}_padded")

    def _check_layers(self, q: Tensor, k: Tensor, v: Tensor, fmt: str) -> None:
        """Ranks, heads, head dims, batch and sequence agreement, dtypes and devices."""
        for name, layer in (("query_layer", q), ("key_layer", k), ("value_layer", v)):
            check_module_input("DotProductAttention", name, layer)
        rank = 3 if fmt == "thd" else 4
        shapes = f"query_layer {tuple(q.shape)}, key_layer {tuple(k.shape)}, value_layer {tuple(v.shape)}"
        if q.dim() != rank or k.dim() != rank or v.dim() != rank:
            raise ValueError(f"qkv_format={fmt!r} takes {rank}-D query/key/value layers, got {shapes}")
        h, g = self.num_attention_heads_per_partition, self.num_gqa_groups_per_partition
        dk, dv = self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v
        if q.shape[-2] != h or k.shape[-2] != g or v.shape[-2] != g:
            raise ValueError(f"expected {h} query heads and {g} key/value heads (num_attention_heads, "
                             f"num_gqa_groups) in dim -2, got {shapes}")
        if q.shape[-1] != dk or k.shape[-1] != dk or v.shape[-1] != dv:
            raise ValueError(f"expected head dims {dk} for query/key and {dv} for value (kv_channels), got {shapes}")
        if k.shape[:-2] != v.shape[:-2]:
            raise ValueError(f"key_layer and value_layer must agree in their leading dims, got {shapes}")
        batch_dim = {"sbhd": 1, "bshd": 0}.get(fmt)
        if batch_dim is not None and q.shape[batch_dim] != k.shape[batch_dim]:
            raise ValueError(f"query and key/value batch sizes differ (dim {batch_dim} of {fmt}): {shapes}")
        if not q.dtype == k.dtype == v.dtype:
            raise ValueError(f"query/key/value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
        if not q.device == k.device == v.device:
            raise ValueError(f"query/key/value devices differ: {q.device}, {k.device}, {v.device}")

    def _padding(self, attention_mask, mask_type: str, b: int, sq: int, skv: int, cu_seqlens_q: Optional[Tensor],
                 cu_seqlens_kv: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """pad_q [b, sq], pad_kv [b, skv] (True = padded) for padding types, else (None, None)."""
        if "padding" not in mask_type:
            return None, None
        if attention_mask is None:
            if cu_seqlens_q is None:
                return None, None
            cu_seqlens_kv = cu_seqlens_q if cu_seqlens_kv is None else cu_seqlens_kv
            return (_pad_from_lengths(cu_seqlens_q, sq, "cu_seqlens_q", b),
                    _pad_from_lengths(cu_seqlens_kv, skv, "cu_seqlens_kv", b))
        if isinstance(attention_mask, Tensor):
            if sq != skv:
                raise ValueError(f"attn_mask_type={mask_type!r} with sq={sq} != skv={skv} needs attention_mask as a "
                                 f"pair ([b, 1, 1, sq], [b, 1, 1, skv]), got one tensor {tuple(attention_mask.shape)}")
            attention_mask = (attention_mask, attention_mask)
        if not isinstance(attention_mask, Sequence) or len(attention_mask) != 2:
            raise ValueError("attention_mask for a padding mask type must be a bool tensor [b, 1, 1, s] or a pair "
                             f"of them, got {type(attention_mask).__name__}")
        return (_pad_from_mask(attention_mask[0], b, sq, "attention_mask (query)"),
                _pad_from_mask(attention_mask[1], b, skv, "attention_mask (key/value)"))

    def _arbitrary_mask(self, attention_mask, b: int, sq: int, skv: int) -> Tensor:
        """The 'arbitrary' mask, checked to broadcast to [b, h, sq, skv]."""
        want = (b, self.num_attention_heads_per_partition, sq, skv)
        if not isinstance(attention_mask, Tensor):
            raise ValueError(f"attn_mask_type='arbitrary' needs attention_mask, a bool tensor broadcastable to {want}")
        fits = attention_mask.dim() == 4 and all(m in (1, w) for m, w in zip(attention_mask.shape, want))
        if not fits or attention_mask.dtype != torch.bool:
            raise ValueError(f"attention_mask for attn_mask_type='arbitrary' must be bool and broadcast to [b, h, "
                             f"sq, skv] = {list(want)}, got {attention_mask.dtype} {tuple(attention_mask.shape)}")
        return attention_mask

    def _bias(self, bias_type: str, bias: Optional[Tensor], alibi_slopes: Optional[Tensor], b: int, sq: int,
              skv: int, device: torch.device) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """(post-scale bias [b | 1, h | 1, sq, skv] or None, ALiBi slopes fp32 [h] or [b, h] or None)
        for core_attention_bias_type; the backends place ALiBi's distances (AttentionProblem)."""
        h = self.num_attention_heads_per_partition
        if bias_type in ("no_bias", "alibi") and bias is not None:
            raise ValueError(f"core_attention_bias {tuple(bias.shape)} was given with "
                             f"core_attention_bias_type={bias_type!r}; use 'pre_scale_bias' or 'post_scale_bias'")
        if bias_type == "no_bias":
            return None, None
        if bias_type == "alibi":
            if alibi_slopes is None:
                first = group_rank(self.tp_group) * h if self.tp_size > 1 else 0  # this rank's heads
                alibi_slopes = masks.default_alibi_slopes(self.num_attention_heads)[first:first + h].to(device)
            if alibi_slopes.shape not in ((h,), (b, h)):
                raise ValueError(f"alibi_slopes must be [h] = [{h}] or [b, h] = [{b}, {h}], "
                                 f"got {tuple(alibi_slopes.shape)}")
            return None, alibi_slopes.float()
        want = (b, h, sq, skv)
        fits = bias is not None and bias.dim() == 4 and all(
            n in (1, w) for n, w in zip(bias.shape[:3], want[:3])) and bias.shape[3] == skv
        if not fits or not bias.is_floating_point():
            raise ValueError(f"core_attention_bias for {bias_type!r} must be a float tensor "
                             f"[1 or b, 1 or h, 1 or sq, skv] with b={b}, h={h}, sq={sq}, skv={skv}, got "
                             f"{None if bias is None else (bias.dtype, tuple(bias.shape))}")
        # One row for every query (TE's '111s' and kin): a view whose query stride is 0, which
        # the backends read as they read [.., sq, skv]; its gradient sums over the queries.
        bias = bias.expand(bias.shape[0], bias.shape[1], sq, skv)  # [1|b, 1|h, sq, skv]
        # softmax(scale * (q k^T + bias)) == softmax(scale * q k^T + scale * bias)
        return (bias * self.softmax_scale if bias_type == "pre_scale_bias" else bias), None


def _values(t: Tensor) -> Tensor:
    """An FP8 tensor's values in its nominal dtype (differentiable); any other tensor as it is."""
    return t.dequantize() if isinstance(t, QuantizedTensor) else t


def _autocast_unless_fp8(t: Tensor) -> Tensor:
    """torch.autocast's dtype for a high-precision input (autocast_input); an FP8 tensor as it is."""
    return t if isinstance(t, QuantizedTensor) else autocast_input(t)


def _trailing(fmt: str, attention_mask, pad_q: Optional[Tensor], pad_kv: Optional[Tensor]) -> bool:
    """Whether the pads pad only the ends of the sequences: always when they come from lengths
    (cu_seqlens, thd); for a user's attention_mask only where reading it is free (eager, CPU),
    so that a compiled graph or an accelerator never waits on it."""
    if fmt == "thd" or attention_mask is None or (pad_q is None and pad_kv is None):
        return True
    if torch.compiler.is_compiling() or pad_q.device.type != "cpu":
        return False
    return all(pad is None or masks.pads_only_the_end(pad) for pad in (pad_q, pad_kv))


def _pad_from_mask(mask: Tensor, b: int, s: int, name: str) -> Tensor:
    """A padding mask [b, 1, 1, s] (True = padded) -> [b, s]."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (b, 1, 1, s):
        got = (mask.dtype, tuple(mask.shape)) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a bool tensor [b, 1, 1, s] = [{b}, 1, 1, {s}], got {got}")
    return mask.view(b, s)


def _cumulative_cpu(lengths: List[int]) -> Tensor:
    """int64 [len(lengths) + 1] on the CPU: 0, then the running sums of `lengths`."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)


def _pad_from_lengths(cu_seqlens: Tensor, s: int, name: str, b: int) -> Tensor:
    """cu_seqlens [b + 1] -> [b, s], True past each sequence's length."""
    if tuple(cu_seqlens.shape) != (b + 1,):
        raise ValueError(f"{name} must be [b + 1] = [{b + 1}], got {tuple(cu_seqlens.shape)}")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # [b]
    return torch.arange(s, device=cu_seqlens.device) >= lengths.unsqueeze(-1)
