"""Fused optimizers (te.optimizers) and TE's multi-tensor helpers (multi_tensor.py)."""
from .fused_adam import FusedAdam
from .fused_sgd import FusedSGD
from .multi_tensor import (MultiTensorApply, multi_tensor_applier, multi_tensor_l2norm, multi_tensor_scale,
                           multi_tensor_scale_tensor)

__all__ = ["FusedAdam", "FusedSGD", "MultiTensorApply", "multi_tensor_applier", "multi_tensor_l2norm", "multi_tensor_scale",
           "multi_tensor_scale_tensor"]
