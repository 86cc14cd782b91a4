"""transformer_engine.pytorch.quantization: where TransformerEngine 2.x keeps its FP8 entry
points (the same objects as transformer_engine.pytorch.fp8), plus the delayed-scaling update
helpers TE code calls by name, QuantizerRole, which names a tensor slot, and the requests a
CustomRecipe factory may return (tensor/requests.py)."""
import dataclasses

import torch

from ..common.recipe import DelayedScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling
from .fp8 import (FP8GlobalStateManager, autocast, check_fp8_block_scaling_support, check_fp8_support,
                  check_mxfp8_support, check_nvfp4_support, fp8_autocast, fp8_model_init, get_default_fp8_recipe,
                  get_default_recipe, get_fp8_max, get_fp8_te_dtype, get_fp8_torch_dtype, is_fp8_available, is_fp8_block_scaling_available,
                  is_mxfp8_available, is_nvfp4_available, quantized_model_init)
from .scaling import delayed_scale, update_delayed_scaling
from .tensor.float8_blockwise_tensor import Float8BlockQuantizer
from .tensor.for_recipe import block_quantizer, nvfp4_quantizer
from .tensor.mxfp8_tensor import MXFP8Quantizer
from .tensor.nvfp4_tensor import NVFP4Quantizer
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
    GEMM) or 'backward' (slots (grad_output, grad_input)), the slot count, and each slot's
    QuantizerRole where the caller names them (roles: one per slot, None entries allowed).

    A slot's tensor type is its role's where that is one of the GEMM modules' (input, weight,
    output, grad_output, grad_input), else the slot's position; its kind, which picks the
    recipe's settings, is 'grad' for gradients, 'weight' for weights, 'input' otherwise."""
    recipe_type: type
    _KINDS = {"input": "input", "output": "input", "weight": "weight", "grad_output": "grad", "grad_input": "grad"}
    _POSITIONS = {"forward": ("input", "weight", "output"), "backward": ("grad_output", "grad_input")}

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

    def _slot_role(self, slot: int) -> "QuantizerRole":
        """The slot's role as given, a bare QuantizerRole() where none is."""
        role = self.roles[slot] if self.roles is not None else None
        return role if role is not None else QuantizerRole()

    def _slot_tensor_type(self, slot: int) -> str:
        tensor_type = self._slot_role(slot).tensor_type
        if tensor_type in self._KINDS:
            return tensor_type
        positions = self._POSITIONS[self.mode]
        return positions[slot % len(positions)]

    def _slot_kind(self, slot: int) -> str:
        return self._KINDS[self._slot_tensor_type(slot)]

    def make_quantizers(self) -> list:
        return [self._quantizer(slot) for slot in range(self.num_quantizers)]


class NVFP4BlockScalingRecipeState(_RecipeState):
    """TE's recipe state of NVFP4BlockScaling: one NVFP4Quantizer per slot, with the recipe's
    settings for the slot's kind."""
    recipe_type = NVFP4BlockScaling

    def _quantizer(self, slot: int) -> NVFP4Quantizer:
        return nvfp4_quantizer(self.recipe, self._slot_kind(slot))


class Float8BlockScalingRecipeState(_RecipeState):
    """TE's recipe state of Float8BlockScaling: one Float8BlockQuantizer per slot, the recipe's
    x / w / grad block dimension by the slot's kind."""
    recipe_type = Float8BlockScaling

    def _quantizer(self, slot: int) -> Float8BlockQuantizer:
        return block_quantizer(self.recipe, self._slot_kind(slot))


class MXFP8BlockScalingRecipeState(_RecipeState):
    """TE's recipe state of MXFP8BlockScaling: one MXFP8Quantizer per slot, E4M3 forward and the
    recipe's gradient format backward. Under enable_2d_quantization, the forward slots whose
    role names a Linear or GroupedLinear weight cast in 32 x 32 blocks (a slot without such a
    role is not taken for a weight)."""
    recipe_type = MXFP8BlockScaling

    def _quantizer(self, slot: int) -> MXFP8Quantizer:
        role = self._slot_role(slot)
        two_d = (self.mode == "forward" and self.recipe.enable_2d_quantization and role.tensor_type == "weight"
                 and role.module_type in ("linear", "grouped_linear"))
        return MXFP8Quantizer(self.recipe.fp8_format.dtype(backward=self.mode == "backward"),
                              with_2d_quantization=two_d)


def get_align_size_for_quantization(recipe) -> int:
    """The row alignment grouped operations (Fp8Padding, GroupedLinear's splits) pad to under
    `recipe`: 32 for MXFP8BlockScaling, 128 for NVFP4BlockScaling, a CustomRecipe's declared
    quantization_alignment, 16 for the others."""
    if recipe.custom():
        return recipe.quantization_alignment
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16


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
           "NVFP4BlockScalingRecipeState", "MXFP8BlockScalingRecipeState", "Float8BlockScalingRecipeState",
           "get_align_size_for_quantization"]
