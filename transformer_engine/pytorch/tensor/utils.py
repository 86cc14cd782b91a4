"""Helpers TE code calls on quantized tensors."""
import torch

from ..fp8.quantized_tensor import QuantizedTensor
from .float8_tensor import Float8Tensor


def replace_raw_data(tensor: QuantizedTensor, new_raw_data: torch.Tensor) -> None:
    """Moves a Float8Tensor's codes into `new_raw_data` (a uint8 buffer of the same shape, e.g.
    a slice of one flat buffer all weights share): the codes are copied over, and the tensor
    then stores them there."""
    if not isinstance(tensor, Float8Tensor):
        raise NotImplementedError(f"replace_raw_data: only Float8Tensor is supported, got {type(tensor).__name__}")
    codes = tensor._storage.operand
    if tuple(new_raw_data.shape) != tuple(codes.data.shape) or new_raw_data.dtype != torch.uint8:
        raise ValueError(f"replace_raw_data: new_raw_data must be uint8 of shape {tuple(codes.data.shape)}, got "
                         f"{new_raw_data.dtype} {tuple(new_raw_data.shape)}")
    new_raw_data.copy_(codes.data.view(torch.uint8))
    codes.data = new_raw_data.view(codes.data.dtype)
