"""transformer_engine.pytorch.quantized_tensor: TE 2.x's home of the quantized-tensor base
classes and of the helpers that save quantized tensors for the backward.

TE keeps some quantized data in storage objects that are not torch.Tensors, so a custom
autograd function splits them into tensors for `ctx.save_for_backward` (prepare_for_saving)
and joins them again in the backward (restore_from_saved, restore_from_func_ctx). Every
quantized tensor of this package is a torch.Tensor subclass (fp8/quantized_tensor.py), which
save_for_backward takes as it is: the helpers keep TE's contract (the same lists, in the same
order) and pass each tensor through.
"""
from typing import List, Optional, Tuple, Union

import torch

from .fp8.quantized_tensor import QuantizedTensor
from .tensor import QuantizedTensorStorage
from .tensor.quantizer import Quantizer

__all__ = ["QuantizedTensor", "QuantizedTensorStorage", "Quantizer", "prepare_for_saving", "restore_from_saved",
           "restore_from_func_ctx"]

SavedList = List[Optional[torch.Tensor]]


def prepare_for_saving(*tensors: Optional[torch.Tensor]) -> Tuple[SavedList, List[None]]:
    """(the tensors for ctx.save_for_backward, one storage object per argument): the tensors
    as given, and None for each (no argument needs splitting here)."""
    for position, tensor in enumerate(tensors):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"prepare_for_saving: argument {position} must be a tensor or None, got "
                            f"{type(tensor).__name__}")
    return list(tensors), [None] * len(tensors)


def restore_from_saved(tensor_objects: List[None], saved_tensors: SavedList,
                       return_saved_tensors: bool = False) -> Union[SavedList, Tuple[SavedList, SavedList]]:
    """The tensors prepare_for_saving split, in order: one saved tensor per object of
    `tensor_objects`; with return_saved_tensors, also the saved tensors left over."""
    if len(saved_tensors) < len(tensor_objects):
        raise ValueError(f"restore_from_saved: {len(tensor_objects)} tensor objects but only "
                         f"{len(saved_tensors)} saved tensors")
    restored = list(saved_tensors[:len(tensor_objects)])
    rest = list(saved_tensors[len(tensor_objects):])
    return (restored, rest) if return_saved_tensors else restored


def restore_from_func_ctx(ctx: torch.autograd.function.FunctionCtx,
                          return_saved_tensors: bool = False) -> Union[SavedList, Tuple[SavedList, SavedList]]:
    """restore_from_saved(ctx.tensor_objects, ctx.saved_tensors), then drops ctx.tensor_objects
    (TE's contract: a function that saved with prepare_for_saving set ctx.tensor_objects)."""
    tensor_objects = getattr(ctx, "tensor_objects", None)
    if tensor_objects is None:
        raise AttributeError("restore_from_func_ctx: ctx has no .tensor_objects (set it to what prepare_for_saving "
                             "returned)")
    restored = restore_from_saved(tensor_objects, ctx.saved_tensors, return_saved_tensors)
    ctx.tensor_objects = None
    return restored
