"""Attention building blocks (te.attention): rotary position embeddings, multi-head attention."""
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb", "MultiheadAttention"]
