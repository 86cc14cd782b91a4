"""transformer_engine.pytorch.permutation, TE's import path of moe/permutation.py (Megatron-Core imports it)."""
from .moe.permutation import *  # noqa: F401,F403
from .moe.permutation import __all__  # noqa: F401
