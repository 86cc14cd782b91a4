"""te.TransformerLayer: self attention (+ cross attention in a decoder) and an MLP with residuals,
TransformerEngine 2.x's arguments, submodule names and residual/dropout order.

    layer = TransformerLayer(hidden_size=64, ffn_hidden_size=176, num_attention_heads=4)
    y = layer(x)                          # x, y [s, b, 64]; attn_input_format="bshd": [b, s, 64]

Composed from te.MultiheadAttention, te.LayerNormMLP and te.LayerNorm / te.RMSNorm.
"""
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from ._autocast import autocast_input
from .attention import masks
from .attention.multi_head_attention import MultiheadAttention
from .module import LayerNorm, LayerNormMLP, RMSNorm
from .module._tensor_parallel import resolved_size
from .utils import check_module_input

LAYER_TYPES = ("encoder", "decoder")


class DropPath(torch.nn.Module):
    """Stochastic depth: in training, each slice along dim 0 is zeroed with probability drop_prob
    and the others are scaled by 1 / (1 - drop_prob); identity in eval. Dim 0 is the sequence for
    sbhd inputs: TransformerEngine draws along dim 0 whatever the layout, and so does this.
    drop_prob=1 zeroes every slice (the branch is dropped whole, with a zero gradient)."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device) < keep
        return x / keep * mask if keep > 0.0 else x * mask  # x / 0 would turn the zeros into NaN


class TransformerLayer(torch.nn.Module):
    """One transformer block: attention, then MLP, each with a residual connection.

    Args (TransformerEngine's names and defaults): hidden_size, ffn_hidden_size, num_attention_heads,
    num_gqa_groups, layernorm_epsilon, hidden_dropout (after attention and MLP, before the residual
    add), attention_dropout, init_method / output_layer_init_method, layer_number, kv_channels,
    self_attn_mask_type / window_size / bottom_right_diagonal and enc_dec_attn_mask_type /
    enc_dec_window_size / enc_dec_bottom_right_diagonal (defaults, overridable in forward; see
    te.DotProductAttention), softmax_type (the attention sinks of te.DotProductAttention, in
    both attentions), rotary_pos_interleaved (te.MultiheadAttention), params_dtype,
    apply_residual_connection_post_layernorm (residuals taken from the norm outputs),
    output_layernorm (BERT-style: no input norm on the self attention, a norm `layernorm` after
    the block), parallel_attention_mlp (Falcon-style: attention and MLP both read
    the input, out = x + dropout(attn + mlp)), layer_type "encoder" | "decoder" (adds cross attention
    `inter_attention` on encoder_output), drop_path_rate (stochastic depth on the self attention and
    MLP branches, training only), fuse_qkv_params / qkv_weight_interleaved, zero_centered_gamma, bias,
    activation / activation_params (te.LayerNormMLP), normalization "LayerNorm" | "RMSNorm", device,
    attn_input_format "sbhd" | "bshd" | "thd", qk_norm_type / qk_norm_eps / qk_norm_before_rope
    (te.MultiheadAttention). fuse_wgrad_accumulation (needs fuse_qkv_params), sequence_parallel,
    get_rng_state_tracker, set_parallel_mode, tp_* go to the submodules (tensor parallelism with
    set_parallel_mode=True: te.MultiheadAttention's and te.LayerNormMLP's; with sequence_parallel
    the block's input and output are this rank's shard of the sequence); seq_length and
    micro_batch_size are accepted for compatibility (JIT warm-up hints in TE), and so are the
    userbuffers overlap flags ub_tp_comm_overlap and ub_*, which change nothing (as in te.Linear).

    Submodules: `self_attention` (MultiheadAttention, input_layernorm unless output_layernorm),
    `inter_attention` (decoder only), `layernorm_mlp` (LayerNormMLP), `layernorm` (output_layernorm).
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: Optional[int] = None, layernorm_epsilon: float = 1e-5, hidden_dropout: float = 0.1,
                 attention_dropout: float = 0.1, init_method: Optional[Callable] = None,
                 output_layer_init_method: Optional[Callable] = None, layer_number: Optional[int] = None,
                 kv_channels: Optional[int] = None, self_attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, bottom_right_diagonal: Optional[bool] = None,
                 enc_dec_attn_mask_type: str = "no_mask", enc_dec_bottom_right_diagonal: Optional[bool] = None,
                 enc_dec_window_size: Optional[Tuple[int, int]] = None, tp_group=None, tp_size: int = 1,
                 params_dtype: Optional[torch.dtype] = None, get_rng_state_tracker: Optional[Callable] = None,
                 fuse_wgrad_accumulation: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, sequence_parallel: bool = False,
                 apply_residual_connection_post_layernorm: bool = False, output_layernorm: bool = False,
                 parallel_attention_mlp: bool = False, layer_type: str = "encoder", drop_path_rate: float = 0.0,
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False, rotary_pos_interleaved: bool = False,
                 zero_centered_gamma: bool = False, qkv_weight_interleaved: bool = True,
                 ub_tp_comm_overlap: bool = False, ub_overlap_ag: bool = True, ub_overlap_rs: bool = True,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = True, ub_bulk_wgrad: bool = True,
                 bias: bool = True, activation: str = "gelu",
                 activation_params: Optional[dict] = None, normalization: str = "LayerNorm",
                 device: Optional[Union[torch.device, str]] = None, attn_input_format: str = "sbhd",
                 name: Optional[str] = None, qk_norm_type: Optional[str] = None, qk_norm_eps: float = 1e-6,
                 qk_norm_before_rope: bool = False, softmax_type: str = "vanilla"):
        super().__init__()
        _check_arguments(layer_type, parallel_attention_mlp, apply_residual_connection_post_layernorm,
                         output_layernorm, fuse_qkv_params, fuse_wgrad_accumulation, normalization, hidden_dropout,
                         drop_path_rate)
        self.layer_type, self.name = layer_type, name
        self.self_attn_mask_type, self.window_size = self_attn_mask_type, window_size
        self.enc_dec_attn_mask_type, self.enc_dec_window_size = enc_dec_attn_mask_type, enc_dec_window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.enc_dec_bottom_right_diagonal = enc_dec_bottom_right_diagonal
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.output_layernorm, self.parallel_attention_mlp = output_layernorm, parallel_attention_mlp
        self.hidden_dropout = hidden_dropout
        self.attn_input_format = attn_input_format
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        self.tp_size = resolved_size(tp_group, tp_size)
        self.sequence_parallel = self.tp_size > 1 and sequence_parallel
        self.kv_channels = kv_channels or hidden_size // num_attention_heads

        attention = dict(
            hidden_size=hidden_size, num_attention_heads=num_attention_heads, kv_channels=self.kv_channels,
            attention_dropout=attention_dropout, layernorm_epsilon=layernorm_epsilon, init_method=init_method,
            output_layer_init_method=output_layer_init_method, layer_number=layer_number, tp_group=tp_group,
            tp_size=tp_size, num_gqa_groups=num_gqa_groups, fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel,
            params_dtype=params_dtype, return_layernorm_output=apply_residual_connection_post_layernorm,
            set_parallel_mode=set_parallel_mode, fuse_qkv_params=fuse_qkv_params,
            zero_centered_gamma=zero_centered_gamma, qkv_weight_interleaved=qkv_weight_interleaved, bias=bias,
            normalization=normalization, device=device, qkv_format=attn_input_format, qk_norm_type=qk_norm_type,
            qk_norm_eps=qk_norm_eps, qk_norm_before_rope=qk_norm_before_rope,
            rotary_pos_interleaved=rotary_pos_interleaved, seq_length=seq_length, micro_batch_size=micro_batch_size,
            softmax_type=softmax_type)
        # Falcon-style parallel blocks add both branches' biases in one place, so the modules add them.
        self.self_attention = MultiheadAttention(
            **attention, attn_mask_type=self_attn_mask_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, input_layernorm=not output_layernorm, attention_type="self",
            return_bias=not parallel_attention_mlp,
            name=None if name is None else name + ".self_attention")
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                **attention, attn_mask_type=enc_dec_attn_mask_type, window_size=enc_dec_window_size,
                bottom_right_diagonal=enc_dec_bottom_right_diagonal, input_layernorm=True, attention_type="cross",
                return_bias=True,
                name=None if name is None else name + ".inter_attention")
        self.layernorm_mlp = LayerNormMLP(
            hidden_size, ffn_hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
            return_bias=not parallel_attention_mlp, get_rng_state_tracker=get_rng_state_tracker, tp_group=tp_group,
            tp_size=tp_size, init_method=init_method, bias=bias, normalization=normalization, activation=activation,
            activation_params=activation_params, output_layer_init_method=output_layer_init_method,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation, params_dtype=params_dtype,
            return_layernorm_output=apply_residual_connection_post_layernorm, seq_length=seq_length,
            micro_batch_size=micro_batch_size, set_parallel_mode=set_parallel_mode,
            zero_centered_gamma=zero_centered_gamma, device=device,
            name=None if name is None else name + ".layernorm_mlp")
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0.0 else None
        if output_layernorm:
            norm = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = norm(hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
                                  params_dtype=params_dtype, zero_centered_gamma=zero_centered_gamma, device=device)

    def forward(self, hidden_states: Tensor, attention_mask=None, self_attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None, bottom_right_diagonal: Optional[bool] = None,
                encoder_output: Optional[Tensor] = None, enc_dec_attn_mask=None,
                enc_dec_attn_mask_type: Optional[str] = None, enc_dec_window_size: Optional[Tuple[int, int]] = None,
                enc_dec_bottom_right_diagonal: Optional[bool] = None, is_first_microbatch: Optional[bool] = None,
                checkpoint_core_attention: bool = False, inference_params=None,
                rotary_pos_emb: Union[Tensor, Tuple[Tensor, Tensor], None] = None,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Optional[Tensor] = None,
                alibi_slopes: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                cu_seqlens_kv: Optional[Tensor] = None, cu_seqlens_q_padded: Optional[Tensor] = None,
                cu_seqlens_kv_padded: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None, fast_zero_fill: bool = True,
                pad_between_seqs: Optional[bool] = None) -> Tensor:
        """hidden_states: [s, b, hidden] (sbhd), [b, s, hidden] (bshd) or [t, hidden] (thd, with
        cu_seqlens_*, cu_seqlens_*_padded and pad_between_seqs as in te.MultiheadAttention): as in
        TE, self attention takes the q ones (cu_seqlens_q, its padded form, max_seqlen_q) for both
        sides, and a decoder's cross attention the q ones for hidden_states and the kv ones for
        encoder_output.
        attention_mask / enc_dec_attn_mask: True = masked out (see
        te.DotProductAttention); encoder_output: the decoder's cross-attention source. Returns the
        block's output, same shape as hidden_states."""
        self_attn_mask_type = masks.canonical_mask_type(
            self.self_attn_mask_type if self_attn_mask_type is None else self_attn_mask_type)
        window_size = masks.check_set_window_size(self_attn_mask_type,
                                                  self.window_size if window_size is None else window_size)
        enc_dec_attn_mask_type = masks.canonical_mask_type(
            self.enc_dec_attn_mask_type if enc_dec_attn_mask_type is None else enc_dec_attn_mask_type)
        enc_dec_window_size = masks.check_set_window_size(
            enc_dec_attn_mask_type, self.enc_dec_window_size if enc_dec_window_size is None else enc_dec_window_size)
        if bottom_right_diagonal is None:
            bottom_right_diagonal = self.bottom_right_diagonal
        if enc_dec_bottom_right_diagonal is None:
            enc_dec_bottom_right_diagonal = self.enc_dec_bottom_right_diagonal
        check_module_input("TransformerLayer", "hidden_states", hidden_states)
        if self.sequence_parallel and self.seq_length is not None and \
                hidden_states.shape[0] != self.seq_length // self.tp_size:
            raise ValueError(f"TransformerLayer: under sequence parallelism hidden_states holds this rank's "
                             f"seq_length // tp_size = {self.seq_length} // {self.tp_size} positions in dim 0, got "
                             f"shape {tuple(hidden_states.shape)}")
        hidden_states = autocast_input(hidden_states)  # torch.autocast: the residual stream in its dtype, as TE

        attention_outputs = self.self_attention(
            hidden_states, attention_mask=attention_mask, attn_mask_type=self_attn_mask_type,
            window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
            is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention, inference_params=inference_params,
            rotary_pos_emb=rotary_pos_emb, core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
            # Self attention: the keys are the queries' tokens, so q's lengths serve both (TE).
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_q, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_q_padded, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_q,
            fast_zero_fill=fast_zero_fill, pad_between_seqs=pad_between_seqs)
        if self.parallel_attention_mlp:
            residual = hidden_states  # the MLP reads the block input too
        elif self.apply_residual_connection_post_layernorm and not self.output_layernorm:
            out, out_bias, residual = attention_outputs
            hidden_states = self._bias_dropout_add(out, out_bias, residual, self.drop_path)
        else:
            out, out_bias = attention_outputs
            hidden_states = self._bias_dropout_add(out, out_bias, hidden_states, self.drop_path)

        if self.layer_type == "decoder":
            cross_outputs = self.inter_attention(
                hidden_states, attention_mask=enc_dec_attn_mask, attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size, bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                encoder_output=encoder_output,
                is_first_microbatch=is_first_microbatch, checkpoint_core_attention=checkpoint_core_attention,
                core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
                alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
                max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, fast_zero_fill=fast_zero_fill,
                pad_between_seqs=pad_between_seqs)
            if self.apply_residual_connection_post_layernorm:
                out, out_bias, residual = cross_outputs
            else:
                (out, out_bias), residual = cross_outputs, hidden_states
            hidden_states = self._bias_dropout_add(out, out_bias, residual)  # no stochastic depth here (TE)

        mlp_outputs = self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch)
        if self.parallel_attention_mlp:  # both branches already carry their biases
            output = self._bias_dropout_add(attention_outputs, mlp_outputs, residual, self.drop_path)
        elif self.apply_residual_connection_post_layernorm:
            out, out_bias, residual = mlp_outputs
            output = self._bias_dropout_add(out, out_bias, residual, self.drop_path)
        else:
            out, out_bias = mlp_outputs
            output = self._bias_dropout_add(out, out_bias, hidden_states, self.drop_path)
        if self.output_layernorm:
            output = self.layernorm(output)
        return output

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type: str = "p2p") -> None:
        """Context parallelism in the attention modules (te.MultiheadAttention's
        set_context_parallel_group): the layer's input is then this rank's shard of the sequence."""
        self.self_attention.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        if self.layer_type == "decoder":
            self.inter_attention.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def _bias_dropout_add(self, x: Tensor, bias: Optional[Tensor], residual: Tensor,
                          drop_path: Optional[DropPath] = None) -> Tensor:
        """residual + drop_path(dropout(x + bias)), dropout with p=hidden_dropout in training only."""
        if bias is not None:
            x = x + bias
        x = torch.nn.functional.dropout(x, p=self.hidden_dropout, training=self.training)
        if drop_path is not None:
            x = drop_path(x)
        return residual + x


def _check_arguments(layer_type, parallel_attention_mlp, post_layernorm_residual, output_layernorm, fuse_qkv_params,
                     fuse_wgrad_accumulation, normalization, hidden_dropout, drop_path_rate) -> None:
    if layer_type not in LAYER_TYPES:
        raise ValueError(f"TransformerLayer: layer_type={layer_type!r} is not one of {LAYER_TYPES}")
    if parallel_attention_mlp and (layer_type != "encoder" or post_layernorm_residual or output_layernorm):
        raise ValueError("TransformerLayer: parallel_attention_mlp=True needs layer_type='encoder', "
                         f"apply_residual_connection_post_layernorm=False and output_layernorm=False (got "
                         f"{layer_type!r}, {post_layernorm_residual}, {output_layernorm})")
    if fuse_wgrad_accumulation and not fuse_qkv_params:
        raise ValueError("TransformerLayer: fuse_wgrad_accumulation=True needs fuse_qkv_params=True "
                         "(a single QKV weight)")
    if normalization not in ("LayerNorm", "RMSNorm"):
        raise ValueError(f"TransformerLayer: normalization={normalization!r} is not one of ('LayerNorm', 'RMSNorm')")
    if not 0.0 <= hidden_dropout < 1.0:
        raise ValueError(f"TransformerLayer: hidden_dropout={hidden_dropout} must be in [0, 1)")
    if not 0.0 <= drop_path_rate <= 1.0:
        raise ValueError(f"TransformerLayer: drop_path_rate={drop_path_rate} must be in [0, 1]")
