"""te.RMSNorm: TransformerEngine's RMSNorm module on the fused norm op."""
from typing import Iterable, Optional, Union

import torch

from ..custom_ops.norm import rmsnorm
from ..utils import forward_param
from ._norm_common import NormModule, resolve_normalized_shape


class RMSNorm(NormModule):
    """y = x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape`.

    Arguments as te.LayerNorm (normalized_shape, eps, sequence_parallel, params_dtype,
    zero_centered_gamma, device, sm_margin). Parameter: weight [*normalized_shape].
    """

    def __init__(self, normalized_shape: Union[int, Iterable[int], None] = None, eps: float = 1e-5,
                 sequence_parallel: Optional[bool] = None, params_dtype: Optional[torch.dtype] = None,
                 zero_centered_gamma: bool = False, device: Optional[Union[torch.device, str]] = None,
                 sm_margin: int = 0, *, hidden_size: Optional[int] = None):
        super().__init__(resolve_normalized_shape(normalized_shape, hidden_size), eps, sequence_parallel, params_dtype, zero_centered_gamma, device,
                         sm_margin, with_bias=False)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.norm_input(inp)
        y = rmsnorm(x, self.flat(forward_param(self, "weight")), self.eps, self.zero_centered_gamma)
        return y if x is inp else y.view(inp.shape)
