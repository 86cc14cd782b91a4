"""FP8 recipes with TransformerEngine's names, fields and defaults (TE_API.md section 4).

Recipes are frozen dataclasses, validated at construction: a bad field raises ValueError
naming it. Keywords that are not fields are ignored, as TransformerEngine's recipes (pydantic
dataclasses) ignore them: clients pass the fields of other TE versions and recipes
(Megatron-Core: override_linear_precision, params_dtype, device; accelerate: interval, margin).
They describe *how* to scale; the arithmetic lives in transformer_engine.pytorch.fp8.scaling
as pure functions.
"""
import dataclasses
import enum
import functools
from typing import Callable, NamedTuple, Optional, Union

import torch

__all__ = ["Format", "Recipe", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
           "MXFP8BlockScaling"]


class FormatLimits(NamedTuple):
    """Largest finite magnitudes of the FP8 formats used forward and backward."""
    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """FP8 format pairs: E4M3 (max 448) everywhere, E5M2 (max 57344) everywhere, or HYBRID:
    E4M3 for the forward tensors (inputs, weights) and E5M2 for the gradients."""
    E4M3 = FormatLimits(448.0, 448.0)
    E5M2 = FormatLimits(57344.0, 57344.0)
    HYBRID = FormatLimits(448.0, 57344.0)

    def dtype(self, backward: bool) -> torch.dtype:
        """torch dtype of the forward (backward=False) or backward tensors."""
        if self is Format.E5M2 or (self is Format.HYBRID and backward):
            return torch.float8_e5m2
        return torch.float8_e4m3fn


_AMAX_ALGOS = ("max", "most_recent")


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


class Recipe:
    """Base of every recipe; the predicates mirror TransformerEngine's."""

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def float8_block_scaling(self) -> bool:
        return isinstance(self, Float8BlockScaling)

    def mxfp8(self) -> bool:
        return isinstance(self, MXFP8BlockScaling)

    def float8_per_tensor_scaling(self) -> bool:
        return self.delayed() or self.float8_current_scaling()


@_ignoring_other_keywords
@dataclasses.dataclass(frozen=True)
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

    def __post_init__(self):
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


@_ignoring_other_keywords
@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling(Recipe):
    """Per-tensor scale from the amax of the tensor being cast: scale = fp8_max / amax.

    fp8_format: HYBRID (default) or E4M3.
    use_power_2_scales: round every scale down to a power of two (exact rescaling).
    amax_epsilon: lower bound applied to the amax before dividing (0 disables it).
    """
    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False
    amax_epsilon: float = 0.0
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        name = "Float8CurrentScaling"
        _require_format(name, self.fp8_format, (Format.HYBRID, Format.E4M3))
        _require(self.amax_epsilon >= 0, f"{name}: amax_epsilon must be >= 0, got {self.amax_epsilon!r}")


@_ignoring_other_keywords
@dataclasses.dataclass(frozen=True)
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
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        name = "Float8BlockScaling"
        _require_format(name, self.fp8_format, (Format.E4M3, Format.HYBRID))
        _require(self.amax_epsilon >= 0, f"{name}: amax_epsilon must be >= 0, got {self.amax_epsilon!r}")
        for field in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
            _require(getattr(self, field) in (1, 2), f"{name}: {field} must be 1 (1x128) or 2 (128x128), "
                     f"got {getattr(self, field)!r}")


@_ignoring_other_keywords
@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling(Recipe):
    """OCP microscaling: one E8M0 (power-of-two) scale per 32 consecutive elements, its
    exponent rounded up so that no element saturates.

    fp8_format: E4M3 (default) or HYBRID (E5M2 gradients).
    """
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        _require_format("MXFP8BlockScaling", self.fp8_format, (Format.E4M3, Format.HYBRID))
