"""te.ops.LayerNorm and te.ops.RMSNorm: te.LayerNorm / te.RMSNorm with TE's op arguments
(keyword-only eps, device, dtype, zero_centered_gamma, sm_margin)."""
from typing import Iterable, Optional, Union

import torch

from ...module.layernorm import LayerNorm as LayerNormModule
from ...module.rmsnorm import RMSNorm as RMSNormModule
from ..op import BasicOperation


class LayerNorm(BasicOperation, LayerNormModule):
    """Parameters weight and bias [*normalized_shape]."""

    def __init__(self, normalized_shape: Union[int, Iterable[int]], *, eps: float = 1e-5, device=None,
                 dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False, sm_margin=0) -> None:
        LayerNormModule.__init__(self, normalized_shape, eps=eps, params_dtype=dtype,
                                 zero_centered_gamma=zero_centered_gamma, device=device, sm_margin=sm_margin)


class RMSNorm(BasicOperation, RMSNormModule):
    """Parameter weight [*normalized_shape]."""

    def __init__(self, normalized_shape: Union[int, Iterable[int]], *, eps: float = 1e-5, device=None,
                 dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False, sm_margin=0) -> None:
        RMSNormModule.__init__(self, normalized_shape, eps=eps, params_dtype=dtype,
                               zero_centered_gamma=zero_centered_gamma, device=device, sm_margin=sm_margin)
