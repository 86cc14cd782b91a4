"""The quantizer a recipe casts a module's weights with (te.quantized_model_init)."""
from ...common.recipe import Recipe
from .float8_blockwise_tensor import Float8BlockQuantizer
from .float8_tensor import Float8CurrentScalingQuantizer
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
