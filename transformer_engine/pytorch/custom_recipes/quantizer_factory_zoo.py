"""TE main's example factories that mix formats by direction (HybridQuantizer) and keep some
tensors in high precision (IdentityQuantizer). Examples, as TE labels them: not validated
recipes. `linear` below means a Linear or GroupedLinear slot; the GEMMs read the row-wise
usage in the forward (fprop: weight and input), the column-wise one in the backward (dgrad: the
weight's with the output gradient's row-wise; wgrad: the input's and the gradient's)."""
from typing import Optional

from ...common.recipe import Format
from ..constants import DType
from ..quantization import QuantizerRole
from ..tensor.float8_tensor import Float8CurrentScalingQuantizer
from ..tensor.hybrid_tensor import HybridQuantizer
from ..tensor.identity_tensor import IdentityQuantizer
from ..tensor.nvfp4_tensor import NVFP4Quantizer
from ..tensor.requests import DelayedScalingRequest
from .quantizer_factories import mxfp8_factory, nvfp4_factory


def _tensor_type(role: Optional[QuantizerRole], module_types=("linear", "grouped_linear")) -> Optional[str]:
    """The role's tensor type where it is a slot of one of module_types, else None."""
    return role.tensor_type if role is not None and role.module_type in module_types else None


def _plain_nvfp4(row_scaled: bool = False) -> NVFP4Quantizer:
    """1 x 16 NVFP4 without the transform, stochastic rounding or 16 x 16 tiles."""
    return NVFP4Quantizer(with_rht=False, with_post_rht_amax=False, with_2d_quantization=False,
                          stochastic_rounding=False, row_scaled_nvfp4=row_scaled)


def high_precision_fwd_mxfp8_bwd_factory(role: Optional[QuantizerRole]):
    """Forward GEMMs in high precision, backward ones in MXFP8: output gradients MXFP8, every
    other slot Identity row-wise and MXFP8 column-wise."""
    if _tensor_type(role) == "grad_output":
        return mxfp8_factory(role)
    return HybridQuantizer(rowwise_quantizer=IdentityQuantizer(), columnwise_quantizer=mxfp8_factory(role))


def mxfp8_fwd_nvfp4_bwd_factory(role: Optional[QuantizerRole]):
    """fprop in MXFP8, dgrad and wgrad in 1 x 16 NVFP4: inputs MXFP8 row-wise and nvfp4_factory's
    NVFP4 column-wise (the transform for wgrad); weights MXFP8 row-wise and plain NVFP4
    column-wise, cast from the MXFP8 values; output gradients nvfp4_factory's; the rest MXFP8."""
    kind = _tensor_type(role)
    if kind == "input":
        return HybridQuantizer(rowwise_quantizer=mxfp8_factory(role), columnwise_quantizer=nvfp4_factory(role))
    if kind == "weight":
        return HybridQuantizer(rowwise_quantizer=mxfp8_factory(role), columnwise_quantizer=_plain_nvfp4(),
                               columnwise_source="rowwise_dequantized")
    if kind == "grad_output":
        return nvfp4_factory(role)
    return mxfp8_factory(role)


def nvfp4_1d_weight_factory(role: Optional[QuantizerRole]):
    """nvfp4_factory with 1 x 16 weights: plain NVFP4 both ways, the column-wise cast from the
    row-wise cast's values."""
    if _tensor_type(role) == "weight":
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(), columnwise_quantizer=_plain_nvfp4(),
                               columnwise_source="rowwise_dequantized")
    return nvfp4_factory(role)


def mxfp8_fwd_high_precision_bwd_factory(role: Optional[QuantizerRole]):
    """MXFP8 forward, high-precision backward (backward_override="dequantized" by direction):
    inputs and weights MXFP8 row-wise and their MXFP8 values column-wise, output gradients
    unquantized, the rest MXFP8."""
    kind = _tensor_type(role)
    if kind in ("input", "weight"):
        return HybridQuantizer(rowwise_quantizer=mxfp8_factory(role), columnwise_quantizer=IdentityQuantizer(),
                               columnwise_source="rowwise_dequantized")
    if kind == "grad_output":
        return IdentityQuantizer()
    return mxfp8_factory(role)


def nvfp4_row_scaled_fwd_mxfp8_bwd_factory(role: Optional[QuantizerRole]):
    """GroupedLinear (MoE experts): row-scaled NVFP4 inputs and plain NVFP4 weights forward,
    MXFP8 backward cast from those values; everything else MXFP8."""
    kind = _tensor_type(role, ("grouped_linear",))
    if kind in ("input", "weight"):
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(row_scaled=kind == "input"),
                               columnwise_quantizer=mxfp8_factory(role), columnwise_source="rowwise_dequantized")
    return mxfp8_factory(role)


def nvfp4_row_scaled_fwd_high_precision_bwd_factory(role: Optional[QuantizerRole]):
    """Row-scaled NVFP4 inputs and plain NVFP4 weights forward, their values in high precision
    backward, output gradients unquantized, everything else plain NVFP4."""
    kind = _tensor_type(role)
    if kind in ("input", "weight"):
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(row_scaled=kind == "input"),
                               columnwise_quantizer=IdentityQuantizer(), columnwise_source="rowwise_dequantized")
    if kind == "grad_output":
        return IdentityQuantizer()
    return _plain_nvfp4()


def nvfp4_linear_fp8_dpa_factory(role: Optional[QuantizerRole]):
    """NVFP4 Linear slots (nvfp4_factory) and FP8 attention (CustomRecipe(fp8_dpa=True)): the
    softmax output and its gradient (s, dp) delayed scaling, HYBRID, most recent amax of a
    history of 1; attention's other slots and its boundary hints ('dpa_output' /
    'dpa_grad_input' in an otherwise empty role's name) current scaling, E5M2 for its
    gradients."""
    dpa = role is not None and role.module_type == "dpa"
    boundary = role is not None and not role.module_type and ("dpa_output" in role.name
                                                              or "dpa_grad_input" in role.name)
    if dpa and role.tensor_type in ("s", "dp"):
        return DelayedScalingRequest(fp8_format=Format.HYBRID, amax_history_len=1, amax_compute_algo="most_recent",
                                     reduce_amax=True)
    if dpa or boundary:
        gradient = (dpa and role.tensor_type in ("do", "dp", "dqkv")) or (boundary and "dpa_grad_input" in role.name)
        return Float8CurrentScalingQuantizer(DType.kFloat8E5M2 if gradient else DType.kFloat8E4M3)
    return nvfp4_factory(role)
