"""transformer_engine.pytorch.quantization: where TransformerEngine 2.x keeps its FP8 entry
points (the same objects as transformer_engine.pytorch.fp8), plus the delayed-scaling update
helpers TE code calls by name, QuantizerRole, which names a tensor slot, and the requests a
CustomRecipe factory may return (tensor/requests.py)."""
import dataclasses
from typing import Optional

import torch

from ..common.recipe import DelayedScaling, MXFP8BlockScaling, NVFP4BlockScaling
from .fp8 import (FP8GlobalStateManager, autocast, check_fp8_block_scaling_support, check_fp8_support,
                  check_mxfp8_support, check_nvfp4_support, fp8_autocast, fp8_model_init, get_default_fp8_recipe,
                  get_default_recipe, get_fp8_max, get_fp8_te_dtype, get_fp8_torch_dtype, is_fp8_available, is_fp8_block_scaling_available,
                  is_mxfp8_available, is_nvfp4_available, quantized_model_init)
from .scaling import delayed_scale, update_delayed_scaling
from .tensor.for_recipe import nvfp4_quantizer
from .tensor.mxfp8_tensor import MXFP8Quantizer
from .tensor.requests import DelayedScalingRequest, QuantizerRequest


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """Which tensor a quantizer serves: module_type ('linear', 'grouped_linear', ...),
    tensor_type ('input', 'weight', 'grad_output', ...), name (the module's name); '' where
    not known."""
    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __str__(self) -> str:
        parts = [f"{field}={value}" for field, value in dataclasses.asdict(self).items() if value]
        return "|".join(parts) if parts else "QuantizerRole()"


class _RecipeState:
    """What TE's recipe states share: the recipe, 'forward' (slots (input, weight, output) per
    GEMM) or 'backward' (gradients), the slot count, and each slot's QuantizerRole where the
    caller names them (roles: one per slot, or None)."""
    recipe_type: type

    def __init__(self, recipe, *, mode: str, num_quantizers: int = 1, roles=None, device=None) -> None:
        name = type(self).__name__
        if not isinstance(recipe, self.recipe_type):
            raise TypeError(f"{name}: recipe must be {self.recipe_type.__name__}, got {type(recipe).__name__}")
        if mode not in ("forward", "backward"):
            raise ValueError(f"{name}: mode must be 'forward' or 'backward', got {mode!r}")
        if roles is not None and len(roles) != num_quantizers:
            raise ValueError(f"{name}: {len(roles)} roles for {num_quantizers} quantizers")
        self.recipe, self.mode, self.num_quantizers = recipe, mode, num_quantizers
        self.roles = list(roles) if roles is not None else None
        self.device = torch.device(device) if device is not None else None

    def _role(self, slot: int) -> Optional["QuantizerRole"]:
        return self.roles[slot] if self.roles is not None else None


class NVFP4BlockScalingRecipeState(_RecipeState):
    """TE's recipe state of NVFP4BlockScaling: make_quantizers() gives one NVFP4Quantizer per
    slot, as the modules' own slots cast. A slot's QuantizerRole, where given, decides its
    casts in either mode (gradients: grad_output / grad_input; weight; anything else as an
    input); without one, backward slots are gradients and forward ones go by position."""
    recipe_type = NVFP4BlockScaling

    def make_quantizers(self) -> list:
        def role(slot: int) -> str:
            named = self._role(slot)
            if named is not None:
                return {"grad_output": "grad", "grad_input": "grad", "weight": "weight"}.get(named.tensor_type, "input")
            if self.mode == "backward":
                return "grad"
            return "weight" if slot % 3 == 1 else "input"
        return [nvfp4_quantizer(self.recipe, role(slot)) for slot in range(self.num_quantizers)]


class MXFP8BlockScalingRecipeState(_RecipeState):
    """TE's recipe state of MXFP8BlockScaling: one MXFP8Quantizer per slot, E4M3 forward and the
    recipe's gradient format backward. Under enable_2d_quantization, the forward slots whose
    role is a Linear or GroupedLinear weight cast in 32 x 32 blocks; a slot without a role is
    not taken for a weight."""
    recipe_type = MXFP8BlockScaling

    def make_quantizers(self) -> list:
        backward = self.mode == "backward"
        fp8_dtype = self.recipe.fp8_format.dtype(backward=backward)

        def two_d(slot: int) -> bool:
            role = self._role(slot)
            return (not backward and self.recipe.enable_2d_quantization and role is not None
                    and role.tensor_type == "weight" and role.module_type in ("linear", "grouped_linear"))
        return [MXFP8Quantizer(fp8_dtype, with_2d_quantization=two_d(slot)) for slot in range(self.num_quantizers)]


def _default_sf_compute(amax: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: float) -> torch.Tensor:
    """DelayedScaling's scale from an amax: fp8_max / amax / 2**margin, the previous scale kept
    where amax is 0, inf or NaN, FLT_MAX where the quotient overflows."""
    return delayed_scale(amax, scale, fp8_max, margin)


def _amax_and_scale_update(amax_history: torch.Tensor, scale: torch.Tensor, fp8_max: float,
                           recipe: DelayedScaling) -> None:
    """One DelayedScaling update of (amax_history [len, n], scale [n]), in place (TE's helper;
    the modules themselves use scaling.update_delayed_scaling, which returns the values)."""
    history, new_scale = update_delayed_scaling(amax_history, scale, fp8_max, recipe)
    scale.copy_(new_scale)
    amax_history.copy_(history)


__all__ = ["FP8GlobalStateManager", "QuantizerRole", "QuantizerRequest", "DelayedScalingRequest", "autocast", "fp8_autocast", "fp8_model_init",
           "quantized_model_init", "check_fp8_support", "check_mxfp8_support", "check_fp8_block_scaling_support",
           "check_nvfp4_support",
           "get_default_fp8_recipe", "get_default_recipe", "get_fp8_max", "get_fp8_torch_dtype", "is_fp8_available",
           "is_mxfp8_available", "is_fp8_block_scaling_available", "is_nvfp4_available",
           "NVFP4BlockScalingRecipeState", "MXFP8BlockScalingRecipeState"]
