"""How FusedAdam stores a state tensor, and its float32 values for a step.

- float32: as is.
- bfloat16: rounded once on store.
- float16 and uint8 (FP8 E4M3 codes): TE's scaled states. One float32 scale per tensor,
  scale = amax / range (range 65504 for fp16, 448 for E4M3). The stored values are
  value / scale, rounded (E4M3: round to nearest even, saturating), and read back as
  stored * scale. This keeps a small-magnitude moment in the format's precise range.
- int16 "remainders" (store_param_remainders, bf16 params with float32 masters). Only the low
  16 bits of the float32 master are kept. The high 16 bits are the bf16 param itself, which
  the step rounds to nearest even, so the two differ by at most 2^15 in the bits' integer
  value: master bits = (param bits << 16) + remainder, exactly.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..scaling import amax
from ..custom_ops.fp8_cast import fp8_quantize

SCALED_RANGE = {torch.float16: torch.finfo(torch.float16).max, torch.uint8: torch.finfo(torch.float8_e4m3fn).max}
STORED_DTYPES = (torch.float32, torch.bfloat16, *SCALED_RANGE)


def values(stored: Tensor, scale: Optional[Tensor]) -> Tensor:
    """The float32 values of a stored state (scale: its float32 [1] scale, scaled states only)."""
    if stored.dtype == torch.uint8:
        return stored.view(torch.float8_e4m3fn).float() * scale
    if scale is not None:
        return stored.float() * scale
    return stored.float()


def stored_form(value: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Optional[Tensor]]:
    """(value, float32) stored as `dtype`, and its scale (None unless dtype is scaled)."""
    if dtype not in SCALED_RANGE:
        return value.to(dtype), None
    scale = (amax(value) / SCALED_RANGE[dtype]).reshape(1)
    inverse = torch.where(scale > 0, torch.reciprocal(scale), torch.zeros_like(scale))
    if dtype == torch.uint8:
        codes, _ = fp8_quantize(value.contiguous(), inverse, torch.float8_e4m3fn)
        return codes.view(torch.uint8), scale
    return (value * inverse).to(dtype), scale


def master_from_remainder(param: Tensor, remainder: Tensor) -> Tensor:
    """The float32 master of a bf16 param from its int16 remainder."""
    high = param.view(torch.int16).to(torch.int32) << 16
    return (high + remainder.to(torch.int32)).view(torch.float32)


def remainder_of(master: Tensor, param: Tensor) -> Tensor:
    """The int16 remainder of a float32 master whose bf16 rounding is `param`."""
    high = param.view(torch.int16).to(torch.int32) << 16
    return (master.view(torch.int32) - high).to(torch.int16)
