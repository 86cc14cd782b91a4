"""What a CustomRecipe's factory may return instead of a quantizer: a request for a quantizer
whose state the module keeps (TransformerEngine's QuantizerRequest). DelayedScalingRequest asks
for delayed scaling: the module casts that slot with its own fp8_meta scale and amax history,
updated as under the DelayedScaling recipe with the request's parameters."""
import dataclasses
from typing import Callable, Optional, Union

from ...common.recipe import DelayedScaling, Format


@dataclasses.dataclass(frozen=True)
class QuantizerRequest:
    """Base of the requests a CustomRecipe factory may return."""


@dataclasses.dataclass(frozen=True)
class DelayedScalingRequest(QuantizerRequest):
    """Delayed scaling for one slot, with DelayedScaling's parameters. Every request one
    module's factory returns must be equal: they share the module's scaling update."""
    fp8_format: Format = Format.HYBRID
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True

    def as_recipe(self) -> DelayedScaling:
        """The DelayedScaling recipe whose update the requested slots follow (validated as the
        recipe validates its arguments)."""
        return DelayedScaling(fp8_format=self.fp8_format, margin=self.margin, amax_history_len=self.amax_history_len,
                              amax_compute_algo=self.amax_compute_algo,
                              scaling_factor_compute_algo=self.scaling_factor_compute_algo,
                              reduce_amax=self.reduce_amax)
