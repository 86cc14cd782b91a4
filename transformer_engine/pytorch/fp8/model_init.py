"""te.quantized_model_init / te.fp8_model_init: modules built inside keep their weights in FP8.

    with te.quantized_model_init(recipe=recipe.MXFP8BlockScaling()):
        model = te.Linear(4096, 4096)       # model.weight is a QuantizedTensor

Per-tensor recipes (DelayedScaling, Float8CurrentScaling) store each weight as E4M3 codes
with one scale from the weight's own amax, re-derived whenever the weight is written; block
recipes store it in the recipe's weight blocks, in both usages the GEMMs need. Inside
te.autocast the modules use these codes directly; anywhere else the weight reads as its
dequantised values (see quantized_tensor.py). This file holds the region; the casts are
tensor/for_recipe.py's.
"""
import contextlib
import dataclasses
import threading
from typing import Iterator, Optional

import torch

from ...common.recipe import Recipe
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


@dataclasses.dataclass(frozen=True)
class WeightQuantization:
    """What a module decided at construction: the recipe its weights are kept in, and whether
    for training (TE's heuristic: a module built with autograd on keeps both usages of each
    weight, the column-wise one for the backward's GEMMs; built under torch.no_grad() or
    inference_mode, only the row-wise one the forward needs). tensor/for_recipe.py's
    quantized_weight makes the FP8 parameters from it."""
    recipe: Recipe
    preserve_high_precision_init_val: bool
    for_training: bool = True


def weight_quantization_in_force() -> Optional[WeightQuantization]:
    """The weight quantization of an open quantized_model_init region, else None."""
    if not _state.enabled:
        return None
    return WeightQuantization(_state.recipe, _state.preserve_high_precision_init_val, torch.is_grad_enabled())
