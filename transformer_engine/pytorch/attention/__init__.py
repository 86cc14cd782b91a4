"""Attention building blocks (te.attention): rotary position embeddings, DotProductAttention."""
from .dot_product_attention import DotProductAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = ["DotProductAttention", "RotaryPositionEmbedding", "apply_rotary_pos_emb"]
