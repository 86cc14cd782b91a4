"""Attention building blocks (te.attention): rotary position embeddings."""
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb"]
