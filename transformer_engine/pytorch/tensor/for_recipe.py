"""The quantizers of a recipe: the one it casts a module's stored weights with
(te.quantized_model_init), and the one of each FP8 slot of a module (module.quantizers)."""
from ...common.recipe import Recipe
from ..fp8.state import WEIGHT_SLOT
from .float8_blockwise_tensor import Float8BlockQuantizer
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer
from .mxfp8_tensor import MXFP8Quantizer
from .quantizer import Quantizer


def weight_quantizer(recipe: Recipe) -> Quantizer:
    """Per-tensor recipes: the weight's own amax sets its scale, re-derived on every write
    (also under DelayedScaling: a stored weight has no history to delay by). Block recipes:
    the recipe's weight blocks, both usages (the backward's dgrad GEMM reads the column-wise
    copy)."""
    fp8_dtype = recipe.fp8_format.dtype(backward=False)
    if recipe.float8_per_tensor_scaling():
        return Float8CurrentScalingQuantizer(fp8_dtype, columnwise=True)
    if recipe.mxfp8():
        return MXFP8Quantizer(fp8_dtype)
    if recipe.float8_block_scaling():
        return Float8BlockQuantizer(fp8_dtype, block_scaling_dim=recipe.w_block_scaling_dim,
                                    force_pow_2_scales=recipe.use_power_2_scales, amax_epsilon=recipe.amax_epsilon)
    raise NotImplementedError(f"weight_quantizer: no FP8 weight storage for {type(recipe).__name__}")


def slot_quantizer(recipe: Recipe, group, slot: int, backward: bool) -> Quantizer:
    """The quantizer of one slot of a module's FP8 state `group` (an fp8_meta ScalingGroup):
    forward slots come as (input, weight, output) per GEMM, backward ones hold gradients.
    DelayedScaling's casts with the slot's scale and records into the live amax row (views of
    the group's buffers, not copies)."""
    fp8_dtype = recipe.fp8_format.dtype(backward=backward)
    if recipe.delayed():
        return Float8Quantizer(group.scale[slot:slot + 1], group.amax_history[0, slot:slot + 1], fp8_dtype)
    if recipe.float8_current_scaling():
        return Float8CurrentScalingQuantizer(fp8_dtype, group.scale.device, force_pow_2_scales=recipe.use_power_2_scales,
                                             amax_epsilon=recipe.amax_epsilon)
    if recipe.mxfp8():
        return MXFP8Quantizer(fp8_dtype)
    if recipe.float8_block_scaling():
        dim = (recipe.grad_block_scaling_dim if backward else
               recipe.w_block_scaling_dim if slot % 3 == WEIGHT_SLOT else recipe.x_block_scaling_dim)
        return Float8BlockQuantizer(fp8_dtype, block_scaling_dim=dim, force_pow_2_scales=recipe.use_power_2_scales,
                                    amax_epsilon=recipe.amax_epsilon)
    raise NotImplementedError(f"slot_quantizer: no quantizer for {type(recipe).__name__}")
