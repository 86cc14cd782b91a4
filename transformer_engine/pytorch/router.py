"""transformer_engine.pytorch.router, TE's import path of moe/router.py (Megatron-Core imports it)."""
from .moe.router import *  # noqa: F401,F403
from .moe.router import __all__  # noqa: F401
