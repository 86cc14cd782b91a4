"""te.quantized_model_init / te.fp8_model_init: modules built inside keep their weights in FP8.

    with te.quantized_model_init(recipe=recipe.MXFP8BlockScaling()):
        model = te.Linear(4096, 4096)       # model.weight is a QuantizedTensor

Per-tensor recipes (DelayedScaling, Float8CurrentScaling) store each weight as E4M3 codes
with one scale from the weight's own amax, re-derived whenever the weight is written; block
recipes store it in the recipe's weight blocks, in both usages the GEMMs need. Inside
te.autocast the modules use these codes directly; anywhere else the weight reads as its
dequantised values (see quantized_tensor.py).
"""
import contextlib
import threading
from typing import Iterator, Optional

import torch

from ...common.recipe import Recipe
from ..tensor.float8_tensor import per_tensor_layout
from ..tensor.for_recipe import weight_quantizer
from .context import get_default_recipe


class _ModelInit(threading.local):
    def __init__(self):
        self.enabled = False
        self.recipe: Optional[Recipe] = None
        self.preserve_high_precision_init_val = False


_state = _ModelInit()


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                         preserve_high_precision_init_val: bool = False) -> Iterator[None]:
    """Modules created inside keep their weights in FP8 for `recipe` (default: the default
    autocast recipe). preserve_high_precision_init_val=True also keeps each weight's initial
    high-precision values on the CPU: param.get_high_precision_init_val(), released with
    param.clear_high_precision_init_val()."""
    if recipe is not None and not isinstance(recipe, Recipe):
        raise ValueError(f"quantized_model_init: recipe must be a transformer_engine.common.recipe recipe, "
                         f"got {type(recipe).__name__}")
    saved = (_state.enabled, _state.recipe, _state.preserve_high_precision_init_val)
    _state.enabled = enabled
    _state.recipe = recipe or get_default_recipe()
    _state.preserve_high_precision_init_val = preserve_high_precision_init_val
    try:
        yield
    finally:
        _state.enabled, _state.recipe, _state.preserve_high_precision_init_val = saved


def fp8_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                   preserve_high_precision_init_val: bool = False):
    """The older name of quantized_model_init."""
    return quantized_model_init(enabled, recipe, preserve_high_precision_init_val)


def fp8_weight_layout(recipe: Recipe):
    """A key naming how `recipe` casts weights: a stored FP8 weight with the same key is fed
    to the GEMMs as it is; any other recipe casts the dequantised weight afresh. (Read on
    every forward of a module with FP8 weights: the per-tensor key is made without building
    a quantizer, which allocates its scale and amax.)"""
    if recipe.float8_per_tensor_scaling():
        return per_tensor_layout(recipe.fp8_format.dtype(backward=False))
    return weight_quantizer(recipe).layout


class WeightQuantization:
    """What a module decided at construction: the recipe its weights are kept in, and whether
    for training (TE's heuristic: a module built with autograd on keeps both usages of each
    weight, the column-wise one for the backward's GEMMs; built under torch.no_grad() or
    inference_mode, only the row-wise one the forward needs)."""

    def __init__(self, recipe: Recipe, preserve_high_precision_init_val: bool, for_training: bool = True):
        self.recipe = recipe
        self.preserve_high_precision_init_val = preserve_high_precision_init_val
        self.for_training = for_training

    def quantized_parameter(self, values: torch.Tensor, quantizer=None) -> torch.nn.Parameter:
        """A Parameter holding `values` (a 2-D weight) in FP8: a Float8Tensor,
        Float8BlockwiseQTensor or MXFP8Tensor, per the recipe (quantizer: the module's own for
        the weight, see Fp8ModuleMixin.stored_weight)."""
        quantizer = quantizer or weight_quantizer(self.recipe)
        quantizer.set_usage(columnwise=self.for_training)
        weight = quantizer.quantize(values.detach())
        if self.preserve_high_precision_init_val:
            weight._storage.high_precision_init_val = values.detach().cpu().clone()
        return torch.nn.Parameter(weight, requires_grad=values.requires_grad)


def weight_quantization_in_force() -> Optional[WeightQuantization]:
    """The weight quantization of an open quantized_model_init region, else None."""
    if not _state.enabled:
        return None
    return WeightQuantization(_state.recipe, _state.preserve_high_precision_init_val, torch.is_grad_enabled())
