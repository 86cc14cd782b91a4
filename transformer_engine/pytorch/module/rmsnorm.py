"""te.RMSNorm: TransformerEngine's RMSNorm module on the fused norm op."""
from typing import Iterable, Optional, Union

import torch

from ..ops.norm import rmsnorm
from ._norm_common import flatten_normalized, normalized_shape_tuple, parameter_factory


class RMSNorm(torch.nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape`.

    Arguments as te.LayerNorm (normalized_shape, eps, sequence_parallel, params_dtype,
    zero_centered_gamma, device, sm_margin). Parameter: weight [*normalized_shape].
    """

    def __init__(self, normalized_shape: Union[int, Iterable[int]], eps: float = 1e-5,
                 sequence_parallel: Optional[bool] = None, params_dtype: Optional[torch.dtype] = None,
                 zero_centered_gamma: bool = False, device: Optional[Union[torch.device, str]] = None,
                 sm_margin: int = 0):
        super().__init__()
        self.normalized_shape = normalized_shape_tuple(normalized_shape)
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = sequence_parallel
        self.sm_margin = sm_margin
        factory = parameter_factory(params_dtype, device)
        self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, **factory))
        self.weight.sequence_parallel = sequence_parallel
        if factory["device"].type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = flatten_normalized("RMSNorm", inp, self.normalized_shape)
        y = rmsnorm(x, self.weight.reshape(-1), self.eps, self.zero_centered_gamma)
        return y.view(inp.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"
