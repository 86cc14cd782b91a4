"""transformer_engine.pytorch.quantization: where TransformerEngine 2.x keeps its FP8 entry
points (the same objects as transformer_engine.pytorch.fp8), plus the delayed-scaling update
helpers TE code calls by name, QuantizerRole, which names a tensor slot, and the requests a
CustomRecipe factory may return (tensor/requests.py)."""
import dataclasses

import torch

from ..common.recipe import DelayedScaling, NVFP4BlockScaling
from .fp8 import (FP8GlobalStateManager, autocast, check_fp8_block_scaling_support, check_fp8_support,
                  check_mxfp8_support, check_nvfp4_support, fp8_autocast, fp8_model_init, get_default_fp8_recipe,
                  get_default_recipe, get_fp8_max, get_fp8_te_dtype, get_fp8_torch_dtype, is_fp8_available, is_fp8_block_scaling_available,
                  is_mxfp8_available, is_nvfp4_available, quantized_model_init)
from .scaling import delayed_scale, update_delayed_scaling
from .tensor.for_recipe import nvfp4_quantizer
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


class NVFP4BlockScalingRecipeState:
    """TE's recipe state of NVFP4BlockScaling: make_quantizers() gives one NVFP4Quantizer per
    slot, for the forward (mode 'forward': slots (input, weight, output) per GEMM) or the
    backward (mode 'backward': gradients), as the modules' own slots cast."""

    def __init__(self, recipe: NVFP4BlockScaling, *, mode: str, num_quantizers: int = 1, device=None) -> None:
        if not isinstance(recipe, NVFP4BlockScaling):
            raise TypeError(f"NVFP4BlockScalingRecipeState: recipe must be NVFP4BlockScaling, got "
                            f"{type(recipe).__name__}")
        if mode not in ("forward", "backward"):
            raise ValueError(f"NVFP4BlockScalingRecipeState: mode must be 'forward' or 'backward', got {mode!r}")
        self.recipe, self.mode, self.num_quantizers = recipe, mode, num_quantizers
        self.device = torch.device(device) if device is not None else None

    def make_quantizers(self) -> list:
        def role(slot: int) -> str:
            if self.mode == "backward":
                return "grad"
            return "weight" if slot % 3 == 1 else "input"
        return [nvfp4_quantizer(self.recipe, role(slot)) for slot in range(self.num_quantizers)]


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
           "NVFP4BlockScalingRecipeState"]
