"""Per-tensor FP8 casts in plain PyTorch, with the ops' signatures and semantics.

Shapes: data has input's shape; scale / scale_inv hold one float32 element; amax is a
float32 scalar. The cast saturates: |input * scale| beyond the format's max becomes +-max
(PyTorch's own casts disagree across formats on overflow, so the clamp comes first); NaN
stays NaN. amax skips NaN elements and counts inf (scaling.py's amax rule).
"""
from typing import Callable, Tuple

import torch
from torch import Tensor

from .. import scaling


def fp8_quantize(input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    fp8_max = torch.finfo(fp8_dtype).max
    scaled = input.float() * scale.float().reshape(())
    data = scaled.clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return data, scaling.amax(input)


def fp8_quantize_current(input: Tensor, fp8_dtype: torch.dtype, amax_epsilon: float, power_2: bool,
                         cast: Callable = fp8_quantize) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Current scaling's cast: (data, scale, scale_inv, amax), the scale from the input's own
    amax (scaling.current_scale); scale, scale_inv and amax float32 [1]. cast: the per-tensor
    cast that writes the codes (fp8_quantize's signature; a Triton kernel's on GPUs)."""
    amax = scaling.amax(input).reshape(1)
    scale = scaling.current_scale(amax, torch.finfo(fp8_dtype).max, amax_epsilon, power_2)
    data, _ = cast(input, scale, fp8_dtype)
    return data, scale, torch.reciprocal(scale), amax


def fp8_quantize_delayed_(input: Tensor, scales: Tensor, slot: int, amax_history: Tensor, amax_recorded: Tensor,
                          fp8_dtype: torch.dtype, cast: Callable = fp8_quantize) -> Tuple[Tensor, Tensor]:
    """DelayedScaling's cast of one slot: (data, scale_inv) at scales[slot], the input's amax
    max-accumulated into amax_history[0, slot] (torch.maximum: a NaN there stays) and the slot
    marked in amax_recorded, in place. cast: as fp8_quantize_current's."""
    scale = scales[slot:slot + 1]
    data, amax = cast(input, scale, fp8_dtype)
    live = amax_history[0, slot]
    live.copy_(torch.maximum(live, amax))
    amax_recorded[slot] = True
    return data, torch.reciprocal(scale)


def fp8_quantize_transpose(input: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """fp8_quantize plus data_t: the codes of input viewed as [M, N] (M = all leading dims),
    transposed to [N, M]."""
    data, amax = fp8_quantize(input, scale, fp8_dtype)
    cols = input.shape[-1]
    rows = input.numel() // cols if cols else 0  # no columns: no rows either (the kernels' rule)
    codes = data.view(torch.uint8).reshape(rows, cols)  # [..., N] -> [M, N]
    return data, codes.t().contiguous().view(fp8_dtype), amax


def fp8_dequantize(data: Tensor, scale_inv: Tensor, out_dtype: torch.dtype) -> Tensor:
    return (data.float() * scale_inv.float().reshape(())).to(out_dtype)


def fp8_transpose(data: Tensor) -> Tensor:
    return data.view(torch.uint8).t().contiguous().view(data.dtype)
