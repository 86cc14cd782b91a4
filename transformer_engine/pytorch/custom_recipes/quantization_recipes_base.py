"""Factories that make CustomRecipe(qfactory=...) cast as a built-in recipe does, bit for bit:

    recipe = CustomRecipe(qfactory=current_scaling_quantizer_factory)

Each takes the slot's QuantizerRole (None where the consumer is unknown) and returns its
quantizer (or, for delayed scaling, a DelayedScalingRequest: the module keeps the state)."""
from typing import Optional

from ...common.recipe import Format, NVFP4BlockScaling
from ..constants import DType
from ..quantization import QuantizerRole
from ..tensor.float8_blockwise_tensor import Float8BlockQuantizer
from ..tensor.float8_tensor import Float8CurrentScalingQuantizer
from ..tensor.mxfp8_tensor import MXFP8Quantizer
from ..tensor.for_recipe import nvfp4_quantizer
from ..tensor.nvfp4_tensor import NVFP4Quantizer
from ..tensor.requests import DelayedScalingRequest


def _is_gradient(role: Optional[QuantizerRole]) -> bool:
    return role is not None and role.tensor_type == "grad_output"


def _is_linear_weight(role: Optional[QuantizerRole]) -> bool:
    return role is not None and role.module_type in ("linear", "grouped_linear") and role.tensor_type == "weight"


def delayed_scaling_quantizer_factory(role: Optional[QuantizerRole]) -> DelayedScalingRequest:
    """DelayedScaling()'s defaults: HYBRID formats, history 1024, amax reduced across ranks."""
    return DelayedScalingRequest(fp8_format=Format.HYBRID)


def current_scaling_quantizer_factory(role: Optional[QuantizerRole]) -> Float8CurrentScalingQuantizer:
    """Float8CurrentScaling()'s: E4M3, and E5M2 for output gradients (HYBRID)."""
    return Float8CurrentScalingQuantizer(DType.kFloat8E5M2 if _is_gradient(role) else DType.kFloat8E4M3)


def mxfp8_quantizer_factory(role: Optional[QuantizerRole]) -> MXFP8Quantizer:
    """MXFP8BlockScaling()'s: E4M3 everywhere, 1 x 32 blocks with E8M0 scales."""
    return MXFP8Quantizer(DType.kFloat8E4M3)


def float8_block_scaling_quantizer_factory(role: Optional[QuantizerRole]) -> Float8BlockQuantizer:
    """Float8BlockScaling()'s: E4M3, power-of-two scales, 128 x 128 blocks for linear weights
    and 1 x 128 for everything else."""
    return Float8BlockQuantizer(DType.kFloat8E4M3, force_pow_2_scales=True, amax_epsilon=0.0,
                                block_scaling_dim=2 if _is_linear_weight(role) else 1)


def nvfp4_quantizer_factory(role: Optional[QuantizerRole]) -> NVFP4Quantizer:
    """NVFP4BlockScaling()'s: 16 x 16 tiles for linear weights; the random Hadamard transform on
    the column-wise usage of everything else, and stochastic rounding of output gradients."""
    kind = "weight" if _is_linear_weight(role) else "grad" if _is_gradient(role) else "input"
    return nvfp4_quantizer(NVFP4BlockScaling(), kind)
