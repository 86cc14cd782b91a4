"""TransformerEngine's process-wide FP8 queries (FP8GlobalStateManager, check_*_support), as read
by code written for TE: Megatron-Core, accelerate, TE's own tests.

TE keeps this state in class attributes that autocast writes. Here it is a read-only view of
the per-thread autocast regions (context.py) and of quantized_model_init (model_init.py):
nothing below holds state of its own, so the two cannot disagree.
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from ...common.recipe import Recipe
from ..constants import DType
from .context import (current_context, get_default_recipe, open_regions, replace_regions, reset_regions,
                      is_nvfp4_available, take_first_module_flag)
from .model_init import weight_quantization_in_force

# Every recipe runs on every device: the CPU kernels and, where no kernel exists, the reference
# ops do the arithmetic of the FP8 hardware (TE_API.md), so none of TE's hardware checks refuses.
_SUPPORTED = (True, "")


def check_fp8_support() -> Tuple[bool, str]:
    """(supported, reason if not) for per-tensor FP8 (DelayedScaling, Float8CurrentScaling)."""
    return _SUPPORTED


def check_mxfp8_support() -> Tuple[bool, str]:
    """(supported, reason if not) for MXFP8BlockScaling."""
    return _SUPPORTED


def check_fp8_block_scaling_support() -> Tuple[bool, str]:
    """(supported, reason if not) for Float8BlockScaling."""
    return _SUPPORTED


def check_nvfp4_support() -> Tuple[bool, str]:
    """(False, why) for NVFP4BlockScaling: is_nvfp4_available's answer."""
    return is_nvfp4_available(return_reason=True)


def get_default_fp8_recipe() -> Recipe:
    return get_default_recipe()


def get_fp8_torch_dtype(fp8_recipe: Recipe, fprop_tensor: bool = True) -> torch.dtype:
    """The torch dtype `fp8_recipe` stores forward (fprop_tensor) or gradient tensors in."""
    return fp8_recipe.fp8_format.dtype(backward=not fprop_tensor)


def get_fp8_te_dtype(fp8_recipe: Recipe, fprop_tensor: bool = True) -> DType:
    """get_fp8_torch_dtype as TE's DType enum (kFloat8E4M3 or kFloat8E5M2)."""
    return DType.of_torch(get_fp8_torch_dtype(fp8_recipe, fprop_tensor))


def get_fp8_max(fp8_recipe: Recipe, fprop_tensor: bool = True) -> float:
    """The largest finite value of that dtype."""
    limits = fp8_recipe.fp8_format.value
    return limits.max_fwd if fprop_tensor else limits.max_bwd


class FP8GlobalStateManager:
    """TransformerEngine's global FP8 state, answered from the autocast regions of this thread."""

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        """Inside te.autocast(enabled=True) (and no enabled=False region nested inside it)."""
        context = current_context()
        return context is not None and context.enabled

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        context = current_context()
        return context is not None and context.calibrating

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        """Inside te.quantized_model_init(enabled=True): new modules keep FP8 weights."""
        return weight_quantization_in_force() is not None

    @classmethod
    def with_high_precision_init_val(cls) -> bool:
        quantization = weight_quantization_in_force()
        return quantization is not None and quantization.preserve_high_precision_init_val

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        """CUDA graph capture is not implemented here: only a capture by torch itself counts."""
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        """True once per enabled outermost autocast region: for the first caller inside it."""
        return take_first_module_flag()

    @classmethod
    def get_fp8_recipe(cls) -> Recipe:
        """The recipe of the innermost open region, else the default recipe."""
        context = current_context()
        return context.recipe if context is not None else get_default_recipe()

    @classmethod
    def get_fp8_group(cls) -> Optional[object]:
        """The amax_reduction_group of the innermost open region (None: the default group)."""
        context = current_context()
        return context.amax_reduction_group if context is not None else None

    @classmethod
    def get_autocast_state(cls) -> tuple:
        """The open regions, to hand back to set_autocast_state()."""
        return open_regions()

    @classmethod
    def set_autocast_state(cls, state: tuple) -> None:
        replace_regions(state)

    @classmethod
    def reset(cls) -> None:
        """Closes every region of this thread without running their pending scale updates."""
        reset_regions()

    @classmethod
    def is_fp8_available(cls) -> Tuple[bool, str]:
        return check_fp8_support()

    @classmethod
    def is_mxfp8_available(cls) -> Tuple[bool, str]:
        return check_mxfp8_support()

    @classmethod
    def is_fp8_block_scaling_available(cls) -> Tuple[bool, str]:
        return check_fp8_block_scaling_support()

    @staticmethod
    def get_meta_tensor_key(forward: bool = True) -> str:
        """The fp8_meta key of the forward or backward scaling state."""
        return "scaling_fwd" if forward else "scaling_bwd"

    @staticmethod
    def get_fwd_bwd_key(forward: bool = True) -> str:
        return "forward" if forward else "backward"

    @staticmethod
    def reduce_tensor_across_group_op_max(tensor: torch.Tensor, group: Optional[object]) -> None:
        """All-reduce (MAX) in place over `group` when torch.distributed is initialised."""
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
