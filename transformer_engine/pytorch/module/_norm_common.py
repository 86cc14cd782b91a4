"""What LayerNorm and RMSNorm modules share: the normalized shape and the input check."""
from typing import Iterable, Tuple, Union

import torch

from ..utils import default_device


def normalized_shape_tuple(normalized_shape: Union[int, Iterable[int]]) -> Tuple[int, ...]:
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"normalized_shape must be a positive int or a non-empty tuple of them, got {normalized_shape!r}")
    return shape


def parameter_factory(params_dtype, device):
    """dtype/device keyword arguments for a module's parameters."""
    return {
        "dtype": params_dtype if params_dtype is not None else torch.get_default_dtype(),
        "device": torch.device(device) if device is not None else default_device(),
    }


def flatten_normalized(module_name: str, inp: torch.Tensor, normalized_shape: Tuple[int, ...]) -> torch.Tensor:
    """[..., *normalized_shape] -> [..., prod(normalized_shape)] after checking the sizes."""
    trailing = tuple(inp.shape[inp.dim() - len(normalized_shape):]) if inp.dim() >= len(normalized_shape) else None
    if trailing != normalized_shape:
        raise ValueError(f"{module_name}: input of shape {tuple(inp.shape)} does not end in the normalized shape "
                         f"{normalized_shape}")
    if len(normalized_shape) == 1:
        return inp
    return inp.reshape(*inp.shape[:inp.dim() - len(normalized_shape)], -1)
