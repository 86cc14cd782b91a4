"""FP8 recipes with TransformerEngine's names, fields and defaults (TE_API.md section 4).

Recipes are mutable dataclasses, as TransformerEngine's are (user code and TE's tests assign
fields after construction), validated at construction and on every assignment: a bad value
raises ValueError naming the field and leaves the recipe as it was. Keywords that are not
fields are ignored, as TransformerEngine's recipes (pydantic dataclasses) ignore them: clients
pass the fields of other TE versions and recipes (Megatron-Core: override_linear_precision,
params_dtype, device; accelerate: interval, margin). They describe *how* to scale; the
arithmetic lives in transformer_engine.pytorch.scaling as pure functions.

CustomRecipe runs with a qfactory (te.autocast refuses one without).
"""
import dataclasses
import enum
import functools
from typing import Callable, NamedTuple, Optional, Union

import torch

__all__ = ["Format", "MMParams", "QParams", "Recipe", "DelayedScaling", "Float8CurrentScaling",
           "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling", "CustomRecipe"]


class FormatLimits(NamedTuple):
    """Largest finite magnitudes of the FP8 formats used forward and backward."""
    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """FP8 format pairs: E4M3 (max 448) everywhere, E5M2 (max 57344) everywhere, or HYBRID:
    E4M3 for the forward tensors (inputs, weights) and E5M2 for the gradients; and NVFP4's
    E2M1 (max 6), which has no torch dtype."""
    E2M1 = FormatLimits(6.0, 6.0)
    E4M3 = FormatLimits(448.0, 448.0)
    E5M2 = FormatLimits(57344.0, 57344.0)
    HYBRID = FormatLimits(448.0, 57344.0)

    def dtype(self, backward: bool) -> torch.dtype:
        """torch dtype of the forward (backward=False) or backward tensors."""
        if self is Format.E2M1:
            raise ValueError("Format.E2M1 (FP4) has no torch dtype: FP4 casts are not implemented")
        if self is Format.E5M2 or (self is Format.HYBRID and backward):
            return torch.float8_e5m2
        return torch.float8_e4m3fn


@dataclasses.dataclass(frozen=True)
class MMParams:
    """A GEMM's options. use_split_accumulator: sums kept in fp32 outside the tensor cores'
    accumulators (cuBLAS's fast-accumulation switch); our FP8 GEMMs always sum in fp32."""
    use_split_accumulator: bool = True


@dataclasses.dataclass(frozen=True)
class QParams:
    """One operand's quantisation options, as TransformerEngine's recipes expose them."""
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


_AMAX_ALGOS = ("max", "most_recent")
_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")
# The forward casts NVFP4BlockScaling's 4over6 options apply to.
NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_format(recipe_name: str, fp8_format, allowed) -> None:
    _require(isinstance(fp8_format, Format),
             f"{recipe_name}: fp8_format must be a recipe.Format, got {fp8_format!r}")
    _require(fp8_format in allowed, f"{recipe_name}: fp8_format={fp8_format.name} is not supported; use one of "
             + ", ".join(f.name for f in allowed))


def _ignoring_other_keywords(cls):
    """cls with a constructor that drops keywords which are not its fields (see the module
    docstring); positional arguments and the fields themselves are checked as before."""
    fields = frozenset(field.name for field in dataclasses.fields(cls))
    dataclass_init = cls.__init__

    @functools.wraps(dataclass_init)
    def __init__(self, *args, **kwargs):
        dataclass_init(self, *args, **{name: value for name, value in kwargs.items() if name in fields})

    cls.__init__ = __init__
    return cls


def _require_backward_override(recipe_name: str, value) -> None:
    _require(value in _BACKWARD_OVERRIDES, f"{recipe_name}: backward_override must be None, 'high_precision' or "
                                           f"'dequantized', got {value!r}")


class Recipe:
    """Base of every recipe. Validation runs after construction (__post_init__) and after every
    assignment to a field; the predicates are TransformerEngine's (class methods, so that
    DelayedScaling.delayed() and DelayedScaling().delayed() both answer)."""

    def __post_init__(self) -> None:
        self._validate()
        object.__setattr__(self, "_constructed", True)

    def __setattr__(self, name: str, value) -> None:
        if not self.__dict__.get("_constructed") or name not in self.__dataclass_fields__:
            object.__setattr__(self, name, value)
            return
        previous = self.__dict__[name]
        object.__setattr__(self, name, value)
        try:
            self._validate()
        except ValueError:
            object.__setattr__(self, name, previous)  # a refused value leaves the recipe as it was
            raise

    def _validate(self) -> None:
        """Raises ValueError naming the first field whose value the recipe does not take."""

    @classmethod
    def delayed(cls) -> bool:
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_block_scaling(cls) -> bool:
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def nvfp4(cls) -> bool:
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        return issubclass(cls, CustomRecipe)

    @classmethod
    def mxfp4_qat(cls) -> bool:
        """MXFP4 weight quantisation-aware training on top of a base recipe: none here."""
        return False


@_ignoring_other_keywords
@dataclasses.dataclass
class DelayedScaling(Recipe):
    """Per-tensor scales from a history of past amaxes, updated after each step.

    margin: the scale is divided by 2**margin for headroom.
    fp8_format: HYBRID (default) or E4M3; pure E5M2 training is rejected.
    amax_history_len: rows of amax history kept per tensor (>= 1).
    amax_compute_algo: "max" over the history, "most_recent", or a callable
        amax_history [len, n] -> amax [n].
    scaling_factor_compute_algo: None, or callable(amax, scale, fp8_max, recipe) -> new scale.
    reduce_amax: all-reduce (MAX) amaxes over the autocast's amax_reduction_group.
    fp8_dpa, fp8_mha: FP8 in dot-product attention / the whole attention block.
    """
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def _validate(self) -> None:
        name = "DelayedScaling"
        _require(isinstance(self.margin, (int, float)) and not isinstance(self.margin, bool) and self.margin >= 0,
                 f"{name}: margin must be a non-negative number, got {self.margin!r}")
        _require_format(name, self.fp8_format, (Format.HYBRID, Format.E4M3))
        _require(isinstance(self.amax_history_len, int) and not isinstance(self.amax_history_len, bool)
                 and self.amax_history_len >= 1,
                 f"{name}: amax_history_len must be a positive int, got {self.amax_history_len!r}")
        _require(callable(self.amax_compute_algo) or self.amax_compute_algo in _AMAX_ALGOS,
                 f"{name}: amax_compute_algo must be 'max', 'most_recent' or a callable, "
                 f"got {self.amax_compute_algo!r}")
        _require(self.scaling_factor_compute_algo is None or callable(self.scaling_factor_compute_algo),
                 f"{name}: scaling_factor_compute_algo must be None or a callable, "
                 f"got {self.scaling_factor_compute_algo!r}")
        _require(self.backward_override is None,
                 f"{name}: backward_override must be None (delayed scaling has no other), "
                 f"got {self.backward_override!r}")


@_ignoring_other_keywords
@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    """Per-tensor scale from the amax of the tensor being cast: scale = fp8_max / amax.

    fp8_format: HYBRID (default) or E4M3.
    use_power_2_scales: round every scale down to a power of two (exact rescaling).
    amax_epsilon: lower bound applied to the amax before dividing (0 disables it).
    """
    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False
    amax_epsilon: float = 0.0
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def _validate(self) -> None:
        name = "Float8CurrentScaling"
        _require_format(name, self.fp8_format, (Format.HYBRID, Format.E4M3))
        _require(self.amax_epsilon >= 0, f"{name}: amax_epsilon must be >= 0, got {self.amax_epsilon!r}")
        _require_backward_override(name, self.backward_override)

    @property
    def fp8_quant_fwd_inp(self) -> QParams:
        return QParams(power_2_scale=self.use_power_2_scales, amax_epsilon=self.amax_epsilon)

    fp8_quant_fwd_weight = fp8_quant_bwd_grad = fp8_quant_fwd_inp


@_ignoring_other_keywords
@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    """One fp32 scale per block: 1 x 128 for activations and gradients, 128 x 128 for weights
    (the DeepSeek-V3 / DeepGEMM layout).

    fp8_format: E4M3 (default) or HYBRID (E5M2 gradients).
    use_power_2_scales: power-of-two scales (the default), else plain fp32 scales.
    x_block_scaling_dim, w_block_scaling_dim, grad_block_scaling_dim: 1 for 1 x 128 blocks,
        2 for 128 x 128 blocks.
    """
    fp8_format: Format = Format.E4M3
    use_power_2_scales: bool = True
    amax_epsilon: float = 0.0
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def _validate(self) -> None:
        name = "Float8BlockScaling"
        _require_format(name, self.fp8_format, (Format.E4M3, Format.HYBRID))
        _require(self.amax_epsilon >= 0, f"{name}: amax_epsilon must be >= 0, got {self.amax_epsilon!r}")
        for field in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
            _require(getattr(self, field) in (1, 2), f"{name}: {field} must be 1 (1x128) or 2 (128x128), "
                     f"got {getattr(self, field)!r}")
        _require_backward_override(name, self.backward_override)

    @property
    def fp8_quant_fwd_inp(self) -> QParams:
        return QParams(power_2_scale=self.use_power_2_scales, amax_epsilon=self.amax_epsilon)

    fp8_quant_fwd_weight = fp8_quant_bwd_grad = fp8_quant_fwd_inp


@_ignoring_other_keywords
@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """OCP microscaling: one E8M0 (power-of-two) scale per 32 consecutive elements, its
    exponent rounded up so that no element saturates.

    fp8_format: E4M3 (default) or HYBRID (E5M2 gradients).
    enable_2d_quantization (TE main): the Linear and GroupedLinear weights' forward casts take
        one scale per 32 x 32 block, so the row-wise and column-wise codes are the same.
    """
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None
    enable_2d_quantization: bool = False

    def _validate(self) -> None:
        _require_format("MXFP8BlockScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))
        _require_backward_override("MXFP8BlockScaling", self.backward_override)


@_ignoring_other_keywords
@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """NVIDIA's FP4 recipe: E2M1 values, one E4M3 scale per 16 elements and a per-tensor fp32
    scale, random Hadamard transforms and stochastic rounding where enabled (the numerics:
    transformer_engine/pytorch/reference/nvfp4.py).

    row_scaled_activation: the forward's activation casts (not the weights', not the
        gradients') take one amax per row of the tensor instead of one for all of it; they cast
        the row-wise usage only, so the modules need a backward_override.
    nvfp4_4over6: which forward casts ('none', 'weights', 'activations' or 'all'; never the
        gradients') use 4over6, each block cast twice (its largest value on the code 6 and on
        the code 4) keeping the one with the smaller error, nvfp4_4over6_err_mode 'MAE' or
        'MSE'; not with the Hadamard transform or stochastic rounding of the same operand.
    nvfp4_4over6_e4m3_use_256: which of the 4over6 casts bound their global scale by 256
        instead of 448 (same choices), leaving map-to-4 its 1.5x room in the E4M3 scales."""
    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    row_scaled_activation: bool = False
    nvfp4_4over6: str = "none"
    nvfp4_4over6_e4m3_use_256: str = "all"
    nvfp4_4over6_err_mode: str = "MAE"
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def __post_init__(self) -> None:
        # Each operand's options, from the disable_* flags at construction; plain attributes
        # (not fields), which TE code may replace after, as TE's tests do.
        self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=not self.disable_rht)
        self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        self.fp4_quant_bwd_grad = QParams(random_hadamard_transform=not self.disable_rht,
                                          stochastic_rounding=not self.disable_stochastic_rounding)
        super().__post_init__()

    def _validate(self) -> None:
        name = "NVFP4BlockScaling"
        _require(self.fp4_format is Format.E2M1, f"{name}: fp4_format must be Format.E2M1, got {self.fp4_format!r}")
        _require(self.fp8_format is Format.E4M3, f"{name}: fp8_format must be Format.E4M3, got {self.fp8_format!r}")
        for field in ("nvfp4_4over6", "nvfp4_4over6_e4m3_use_256"):
            value = getattr(self, field)
            _require(value in NVFP4_4OVER6_SCOPES, f"{name}: {field} must be one of {NVFP4_4OVER6_SCOPES}, got "
                                                   f"{value!r}")
        _require(self.nvfp4_4over6_err_mode in ("MAE", "MSE"),
                 f"{name}: nvfp4_4over6_err_mode must be 'MAE' or 'MSE', got {self.nvfp4_4over6_err_mode!r}")
        _require_backward_override(name, self.backward_override)



@_ignoring_other_keywords
@dataclasses.dataclass
class CustomRecipe(Recipe):
    """Quantizers from a user factory (TransformerEngine's experimental API): each FP8 module
    calls qfactory(role) once per slot of its FP8 state when it first runs under the recipe
    (role a transformer_engine.pytorch.quantization.QuantizerRole, or None for a slot whose
    consumer is unknown: a GEMM's output and input gradient) and casts that operand with the
    quantizer returned (Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer or
    Float8BlockQuantizer). fp8_format does not choose the formats (the quantizers do).
    quantization_alignment (TE main): the row padding grouped operations use under this recipe
    (at least the largest any of its quantizers needs), declared since a factory may answer
    per role."""
    qfactory: Optional[Callable] = None
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None
    quantization_alignment: int = 128

    def _validate(self) -> None:
        _require(self.qfactory is None or callable(self.qfactory),
                 f"CustomRecipe: qfactory must be a callable, got {self.qfactory!r}")
        _require(isinstance(self.fp8_format, Format), f"CustomRecipe: fp8_format must be a recipe.Format, got "
                                                     f"{self.fp8_format!r}")
        _require_backward_override("CustomRecipe", self.backward_override)
        _require(isinstance(self.quantization_alignment, int) and self.quantization_alignment > 0,
                 f"CustomRecipe: quantization_alignment must be positive (an int), got {self.quantization_alignment!r}")
