"""TE 2.18's constructor and forward keywords, written down as data (read from NVIDIA
TransformerEngine v2.18's transformer_engine/pytorch sources; TE is not imported): every one is
accepted by the module of the same name here, with TE's default value, and the attention
modules take them in TE's positional order too. A keyword this package cannot honour would have
to raise a clear error only when set to a non-default value; the tests of each module check
what the keywords do."""
import inspect

import pytest
import torch

import transformer_engine.pytorch as te

REQUIRED = object()  # a parameter without a default in TE

# (class, method) -> [(keyword, TE 2.18's default), ...] in TE's order, self left out.
TE_2_18 = {
    ("Linear", "__init__"): [('in_features', REQUIRED), ('out_features', REQUIRED), ('sequence_parallel', False),
        ('fuse_wgrad_accumulation', False), ('tp_group', None), ('tp_size', 1), ('get_rng_state_tracker', None),
        ('rng_tracker_name', None), ('init_method', None), ('bias', True), ('return_bias', False),
        ('params_dtype', None), ('parallel_mode', None), ('parameters_split', None), ('device', 'cuda'),
        ('ub_overlap_ag', False), ('ub_overlap_rs', False), ('ub_overlap_rs_dgrad', False), ('ub_bulk_dgrad', False),
        ('ub_bulk_wgrad', False), ('ub_name', None), ('delay_wgrad_compute', False), ('symmetric_ar_type', None),
        ('save_original_input', False), ('name', None)],
    ("Linear", "forward"): [('inp', REQUIRED), ('is_first_microbatch', None), ('fp8_output', False),
        ('fp8_grad', False)],
    ("LayerNormLinear", "__init__"): [('in_features', REQUIRED), ('out_features', REQUIRED), ('eps', 1e-05),
        ('sequence_parallel', False), ('fuse_wgrad_accumulation', False), ('tp_group', None), ('tp_size', 1),
        ('get_rng_state_tracker', None), ('init_method', None), ('bias', True), ('normalization', 'LayerNorm'),
        ('return_bias', False), ('params_dtype', None), ('parallel_mode', None), ('return_layernorm_output', False),
        ('return_layernorm_output_gathered', False), ('parameters_split', None), ('zero_centered_gamma', False),
        ('device', 'cuda'), ('ub_overlap_ag', False), ('ub_overlap_rs', False), ('ub_overlap_rs_dgrad', False),
        ('ub_bulk_wgrad', False), ('ub_bulk_dgrad', False), ('ub_name', None), ('delay_wgrad_compute', False),
        ('symmetric_ar_type', None), ('name', None)],
    ("LayerNormLinear", "forward"): [('inp', REQUIRED), ('is_first_microbatch', None), ('fp8_output', False),
        ('fp8_grad', False)],
    ("LayerNormMLP", "__init__"): [('hidden_size', REQUIRED), ('ffn_hidden_size', REQUIRED), ('eps', 1e-05),
        ('sequence_parallel', False), ('return_bias', False), ('get_rng_state_tracker', None), ('tp_group', None),
        ('tp_size', 1), ('init_method', None), ('bias', True), ('normalization', 'LayerNorm'),
        ('activation', 'gelu'), ('activation_params', None), ('output_layer_init_method', None),
        ('fuse_wgrad_accumulation', False), ('params_dtype', None), ('return_layernorm_output', False),
        ('return_layernorm_output_gathered', False), ('seq_length', None), ('micro_batch_size', None),
        ('set_parallel_mode', False), ('zero_centered_gamma', False), ('device', 'cuda'), ('ub_overlap_ag', False),
        ('name', None), ('ub_overlap_rs', False), ('ub_overlap_rs_dgrad', False), ('ub_bulk_dgrad', False),
        ('ub_bulk_wgrad', False), ('delay_wgrad_compute', False), ('symmetric_ar_type', None), ('checkpoint', False)],
    ("LayerNormMLP", "forward"): [('inp', REQUIRED), ('is_first_microbatch', None)],
    ("GroupedLinear", "__init__"): [('num_gemms', REQUIRED), ('in_features', REQUIRED), ('out_features', REQUIRED),
        ('sequence_parallel', False), ('fuse_wgrad_accumulation', False), ('tp_group', None), ('tp_size', 1),
        ('get_rng_state_tracker', None), ('rng_tracker_name', None), ('init_method', None), ('bias', True),
        ('return_bias', False), ('params_dtype', None), ('parallel_mode', None), ('device', 'cuda'),
        ('ub_overlap_rs', False), ('ub_overlap_ag', False), ('ub_name', None), ('delay_wgrad_compute', False),
        ('save_original_input', False), ('single_grouped_weight', False), ('single_grouped_bias', False),
        ('name', None)],
    ("GroupedLinear", "forward"): [('inp', REQUIRED), ('m_splits', REQUIRED), ('is_first_microbatch', None),
        ('out', None), ('dgrad_out', None)],
    ("LayerNorm", "__init__"): [('normalized_shape', None), ('eps', 1e-05), ('sequence_parallel', None),
        ('params_dtype', None), ('zero_centered_gamma', False), ('hidden_size', None)],
    ("RMSNorm", "__init__"): [('normalized_shape', None), ('eps', 1e-05), ('sequence_parallel', None),
        ('params_dtype', None), ('zero_centered_gamma', False), ('hidden_size', None)],
    ("DotProductAttention", "__init__"): [('num_attention_heads', REQUIRED), ('kv_channels', REQUIRED),
        ('num_gqa_groups', None), ('attention_dropout', 0.0), ('qkv_format', 'sbhd'), ('attn_mask_type', 'causal'),
        ('window_size', None), ('bottom_right_diagonal', None), ('sequence_parallel', False), ('tp_size', 1),
        ('get_rng_state_tracker', None), ('tp_group', None), ('layer_number', None), ('attention_type', 'self'),
        ('cp_group', None), ('cp_global_ranks', None), ('cp_stream', None), ('cp_comm_type', 'p2p'),
        ('softmax_scale', None), ('softmax_type', 'vanilla'), ('return_max_logit', False), ('name', None)],
    ("DotProductAttention", "forward"): [('query_layer', REQUIRED), ('key_layer', REQUIRED),
        ('value_layer', REQUIRED), ('attention_mask', None), ('qkv_format', None), ('cu_seqlens_q', None),
        ('cu_seqlens_kv', None), ('cu_seqlens_q_padded', None), ('cu_seqlens_kv_padded', None),
        ('max_seqlen_q', None), ('max_seqlen_kv', None), ('attn_mask_type', None), ('window_size', None),
        ('bottom_right_diagonal', None), ('checkpoint_core_attention', False),
        ('core_attention_bias_type', 'no_bias'), ('core_attention_bias', None), ('alibi_slopes', None),
        ('fast_zero_fill', True), ('inference_params', None), ('pad_between_seqs', None), ('fp8_output', False),
        ('num_splits', 1), ('score_mod', None), ('score_mod_bprop', None), ('score_mod_tensors', None),
        ('score_mod_bprop_tensors', None)],
    ("MultiheadAttention", "__init__"): [('hidden_size', REQUIRED), ('num_attention_heads', REQUIRED),
        ('kv_channels', None), ('attention_dropout', 0.1), ('layernorm_epsilon', 1e-05), ('init_method', None),
        ('output_layer_init_method', None), ('layer_number', None), ('attn_mask_type', 'causal'),
        ('window_size', None), ('bottom_right_diagonal', None), ('tp_group', None), ('tp_size', 1),
        ('num_gqa_groups', None), ('fuse_wgrad_accumulation', False), ('get_rng_state_tracker', None),
        ('sequence_parallel', False), ('params_dtype', None), ('return_bias', False),
        ('return_layernorm_output', False), ('input_layernorm', False), ('attention_type', 'self'),
        ('set_parallel_mode', False), ('fuse_qkv_params', False), ('zero_centered_gamma', False),
        ('qkv_weight_interleaved', True), ('rotary_pos_interleaved', False), ('ub_overlap_ag', False),
        ('ub_overlap_rs', False), ('ub_overlap_rs_dgrad', False), ('ub_bulk_dgrad', False), ('ub_bulk_wgrad', False),
        ('bias', True), ('normalization', 'LayerNorm'), ('device', 'cuda'), ('qkv_format', 'sbhd'), ('name', None),
        ('qk_norm_type', None), ('qk_norm_eps', 1e-06), ('qk_norm_before_rope', False), ('seq_length', None),
        ('micro_batch_size', None), ('softmax_type', 'vanilla')],
    ("MultiheadAttention", "forward"): [('hidden_states', REQUIRED), ('attention_mask', None),
        ('encoder_output', None), ('attn_mask_type', None), ('window_size', None), ('bottom_right_diagonal', None),
        ('is_first_microbatch', None), ('checkpoint_core_attention', False), ('inference_params', None),
        ('rotary_pos_emb', None), ('core_attention_bias_type', 'no_bias'), ('core_attention_bias', None),
        ('alibi_slopes', None), ('cu_seqlens_q', None), ('cu_seqlens_kv', None), ('cu_seqlens_q_padded', None),
        ('cu_seqlens_kv_padded', None), ('max_seqlen_q', None), ('max_seqlen_kv', None), ('fast_zero_fill', True),
        ('pad_between_seqs', None)],
    ("TransformerLayer", "__init__"): [('hidden_size', REQUIRED), ('ffn_hidden_size', REQUIRED),
        ('num_attention_heads', REQUIRED), ('num_gqa_groups', None), ('layernorm_epsilon', 1e-05),
        ('hidden_dropout', 0.1), ('attention_dropout', 0.1), ('init_method', None),
        ('output_layer_init_method', None), ('layer_number', None), ('kv_channels', None),
        ('self_attn_mask_type', 'causal'), ('window_size', None), ('bottom_right_diagonal', None),
        ('enc_dec_attn_mask_type', 'no_mask'), ('enc_dec_bottom_right_diagonal', None),
        ('enc_dec_window_size', None), ('tp_group', None), ('tp_size', 1), ('params_dtype', None),
        ('get_rng_state_tracker', None), ('fuse_wgrad_accumulation', False), ('seq_length', None),
        ('micro_batch_size', None), ('sequence_parallel', False),
        ('apply_residual_connection_post_layernorm', False), ('output_layernorm', False),
        ('parallel_attention_mlp', False), ('layer_type', 'encoder'), ('drop_path_rate', 0.0),
        ('set_parallel_mode', False), ('fuse_qkv_params', False), ('rotary_pos_interleaved', False),
        ('zero_centered_gamma', False), ('qkv_weight_interleaved', True), ('ub_tp_comm_overlap', False),
        ('ub_overlap_ag', True), ('ub_overlap_rs', True), ('ub_overlap_rs_dgrad', False), ('ub_bulk_dgrad', True),
        ('ub_bulk_wgrad', True), ('bias', True), ('activation', 'gelu'), ('activation_params', None),
        ('normalization', 'LayerNorm'), ('device', 'cuda'), ('attn_input_format', 'sbhd'), ('name', None),
        ('qk_norm_type', None), ('qk_norm_eps', 1e-06), ('qk_norm_before_rope', False), ('softmax_type', 'vanilla')],
    ("TransformerLayer", "forward"): [('hidden_states', REQUIRED), ('attention_mask', None),
        ('self_attn_mask_type', None), ('window_size', None), ('bottom_right_diagonal', None),
        ('encoder_output', None), ('enc_dec_attn_mask', None), ('enc_dec_attn_mask_type', None),
        ('enc_dec_window_size', None), ('enc_dec_bottom_right_diagonal', None), ('is_first_microbatch', None),
        ('checkpoint_core_attention', False), ('inference_params', None), ('rotary_pos_emb', None),
        ('core_attention_bias_type', 'no_bias'), ('core_attention_bias', None), ('alibi_slopes', None),
        ('cu_seqlens_q', None), ('cu_seqlens_kv', None), ('cu_seqlens_q_padded', None),
        ('cu_seqlens_kv_padded', None), ('max_seqlen_q', None), ('max_seqlen_kv', None), ('fast_zero_fill', True),
        ('pad_between_seqs', None)],
    ("RotaryPositionEmbedding", "__init__"): [('dim', REQUIRED), ('rotary_percent', 1.0),
        ('seq_len_interpolation_factor', None), ('pretrained_max_position_embeddings', None),
        ('rotary_base', 10000.0), ('interleaved', False)],
    ("RotaryPositionEmbedding", "forward"): [('max_seq_len', REQUIRED), ('offset', 0)],
    ("Fp8Padding", "__init__"): [('num_gemms', REQUIRED), ('align_size', None)],
    ("Fp8Padding", "forward"): [('inp', REQUIRED), ('m_splits', REQUIRED)],
    ("Fp8Unpadding", "__init__"): [('num_gemms', REQUIRED), ('align_size', None)],
    ("Fp8Unpadding", "forward"): [('inp', REQUIRED), ('m_splits', REQUIRED)],
}

# Modules whose positional order is TE's. The GEMM modules keep torch.nn.Linear's third
# positional argument (bias) for convert_model's drop-in use, and the norms torch.nn.LayerNorm's.
TE_POSITIONAL_ORDER = {"DotProductAttention", "MultiheadAttention", "TransformerLayer", "RotaryPositionEmbedding",
                       "Fp8Padding", "Fp8Unpadding"}

# Values for TE's required parameters, so that each module can be built and called.
HIDDEN, HEADS, TOKENS = 32, 4, 6
REQUIRED_INIT = {
    "Linear": {"in_features": HIDDEN, "out_features": 16},
    "LayerNormLinear": {"in_features": HIDDEN, "out_features": 16},
    "LayerNormMLP": {"hidden_size": HIDDEN, "ffn_hidden_size": 64},
    "GroupedLinear": {"num_gemms": 2, "in_features": HIDDEN, "out_features": 16},
    "LayerNorm": {"normalized_shape": HIDDEN},
    "RMSNorm": {"normalized_shape": HIDDEN},
    "DotProductAttention": {"num_attention_heads": HEADS, "kv_channels": HIDDEN // HEADS},
    "MultiheadAttention": {"hidden_size": HIDDEN, "num_attention_heads": HEADS},
    "TransformerLayer": {"hidden_size": HIDDEN, "ffn_hidden_size": 64, "num_attention_heads": HEADS},
    "RotaryPositionEmbedding": {"dim": HIDDEN // HEADS},
    "Fp8Padding": {"num_gemms": 2},
    "Fp8Unpadding": {"num_gemms": 2},
}


def required_forward(name):
    x = torch.randn(TOKENS, 2, HIDDEN)
    heads = torch.randn(TOKENS, 2, HEADS, HIDDEN // HEADS)
    return {
        "Linear": {"inp": x}, "LayerNormLinear": {"inp": x}, "LayerNormMLP": {"inp": x},
        "GroupedLinear": {"inp": x.view(-1, HIDDEN), "m_splits": [5, 7]},
        "DotProductAttention": {"query_layer": heads, "key_layer": heads, "value_layer": heads},
        "MultiheadAttention": {"hidden_states": x}, "TransformerLayer": {"hidden_states": x},
        "RotaryPositionEmbedding": {"max_seq_len": TOKENS},
        "Fp8Padding": {"inp": x.view(-1, HIDDEN), "m_splits": [5, 7]},
        "Fp8Unpadding": {"inp": torch.randn(32, HIDDEN), "m_splits": [5, 7]},  # each split padded to 16 rows
    }[name]


def te_defaults(name, method):
    """TE's optional keywords with TE's defaults; device 'cuda' becomes this machine's default."""
    return {kw: (None if kw == "device" else default) for kw, default in TE_2_18[(name, method)]
            if default is not REQUIRED}


@pytest.mark.parametrize("name,method", sorted(TE_2_18), ids=[f"{n}.{m}" for n, m in sorted(TE_2_18)])
def test_every_te_keyword_is_in_the_signature(name, method):
    ours = inspect.signature(getattr(getattr(te, name), method)).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
    missing = [kw for kw, _ in TE_2_18[(name, method)] if kw not in ours and not takes_any]
    assert not missing, f"te.{name}.{method} lacks TE 2.18's {missing}"
    if name in TE_POSITIONAL_ORDER:
        positional = [p.name for p in list(ours.values())[1:]
                      if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        te_order = [kw for kw, _ in TE_2_18[(name, method)]]
        assert positional[:len(te_order)] == te_order, f"te.{name}.{method}'s positional order is not TE's"


@pytest.mark.parametrize("name", sorted(REQUIRED_INIT))
def test_every_te_keyword_at_its_default_is_accepted(name):
    """Built with every TE constructor keyword set to TE's default, and called with every forward
    keyword set to TE's default, each module runs."""
    torch.manual_seed(0)
    module = getattr(te, name)(**{**te_defaults(name, "__init__"), **REQUIRED_INIT[name]})
    if (name, "forward") in TE_2_18:
        module(**required_forward(name), **te_defaults(name, "forward"))
