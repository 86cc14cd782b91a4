"""Attention backends: each declares what it supports; selection takes the first that fits."""
from .base import AttentionBackend, AttentionConfig, AttentionProblem, describe
from .flash import FlashBackend
from .sdpa import SdpaBackend
from .selection import PREFERENCE, select_backend
from .unfused import UnfusedBackend

__all__ = ["AttentionBackend", "AttentionConfig", "AttentionProblem", "describe", "FlashBackend", "SdpaBackend", "UnfusedBackend",
           "PREFERENCE", "select_backend"]
