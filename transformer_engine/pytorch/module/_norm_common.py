"""What te.LayerNorm and te.RMSNorm share: arguments, parameters, initialisation, input check."""
import warnings
from typing import Iterable, Optional, Tuple, Union

import torch

from .._autocast import autocast_input
from ..utils import check_module_input, default_device
from ._init import materialize_parameters


def normalized_shape_tuple(normalized_shape: Union[int, Iterable[int]]) -> Tuple[int, ...]:
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"normalized_shape must be a positive int or a non-empty tuple of them, got {normalized_shape!r}")
    return shape


def resolve_normalized_shape(normalized_shape, hidden_size: Optional[int]):
    """normalized_shape, or TransformerEngine 1.x's deprecated `hidden_size` keyword."""
    if hidden_size is None:
        if normalized_shape is None:
            raise ValueError("normalized_shape is required")
        return normalized_shape
    if normalized_shape is not None:
        raise ValueError(f"give normalized_shape or the deprecated hidden_size, not both "
                         f"(got {normalized_shape!r} and {hidden_size!r})")
    warnings.warn("hidden_size is deprecated, use normalized_shape", DeprecationWarning, stacklevel=3)
    return hidden_size


class NormModule(torch.nn.Module):
    """Holds weight (and bias) of shape normalized_shape, created with TransformerEngine's
    arguments (see te.LayerNorm) and initialised to 1 (0 when zero_centered_gamma) and 0."""

    def __init__(self, normalized_shape: Union[int, Iterable[int]], eps: float, sequence_parallel: Optional[bool],
                 params_dtype: Optional[torch.dtype], zero_centered_gamma: bool,
                 device: Optional[Union[torch.device, str]], sm_margin: int, with_bias: bool):
        super().__init__()
        self.normalized_shape = normalized_shape_tuple(normalized_shape)
        self._multi_dim = len(self.normalized_shape) > 1  # the op normalises one flattened dimension
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = sequence_parallel
        self.sm_margin = sm_margin
        factory = {"dtype": params_dtype if params_dtype is not None else torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, **factory))
        if with_bias:
            self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, **factory))
        for param in self.parameters():
            param.sequence_parallel = sequence_parallel
        if factory["device"].type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        materialize_parameters(self)
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if hasattr(self, "bias"):
                self.bias.zero_()

    def norm_input(self, inp: object) -> torch.Tensor:
        """inp checked (a floating tensor ending in normalized_shape), in torch.autocast's dtype
        where a region is enabled, and as the op's [..., prod(normalized_shape)] (inp itself for
        a 1-D normalized_shape). One pass of cheap checks: on small inputs each Python call here
        is a tenth of the kernel's time."""
        if not (isinstance(inp, torch.Tensor) and inp.is_floating_point() and inp.dim() >= 1):
            check_module_input(type(self).__name__, "inp", inp)  # raises, naming what is wrong
        if torch._C._is_any_autocast_enabled():
            inp = autocast_input(inp)
        if not self._multi_dim:
            if inp.shape[-1] != self.normalized_shape[0]:
                raise self._shape_error(inp)
            return inp
        n = len(self.normalized_shape)
        if inp.dim() < n or inp.shape[-n:] != self.normalized_shape:
            raise self._shape_error(inp)
        return inp.reshape(*inp.shape[:inp.dim() - n], -1)  # [..., *normalized_shape] -> [..., prod]

    def _shape_error(self, inp: torch.Tensor) -> ValueError:
        return ValueError(f"{type(self).__name__}: input of shape {tuple(inp.shape)} does not end in the "
                          f"normalized shape {self.normalized_shape}")

    def flat(self, param: torch.Tensor) -> torch.Tensor:
        """A parameter [*normalized_shape] as the op's [prod(normalized_shape)] (itself when 1-D:
        a reshape would add a view to every call's autograd graph)."""
        return param.reshape(-1) if self._multi_dim else param

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"
