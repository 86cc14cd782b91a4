"""Attention building blocks (te.attention): rotary position embeddings, DotProductAttention,
MultiheadAttention."""
from .dot_product_attention import DotProductAttention
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_fused_qkv_rotary_pos_emb, apply_rotary_pos_emb

__all__ = ["DotProductAttention", "MultiheadAttention", "RotaryPositionEmbedding", "apply_rotary_pos_emb",
           "apply_fused_qkv_rotary_pos_emb"]
