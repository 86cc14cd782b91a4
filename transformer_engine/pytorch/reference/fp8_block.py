"""Block-scaled FP8 casts in plain PyTorch, with the ops' signatures and semantics.

input / data are 2-D [rows, cols]; blocks are block_rows x block_cols (ragged at the
bottom and right edges); scale_inv is [ceil(rows / block_rows), ceil(cols / block_cols)]:
float32 1 / scale for scale_mode 'fp32' and 'pow2' (scale = fp8_max / max(block amax,
amax_epsilon), 'pow2' rounded down to a power of two), uint8 E8M0 exponents for 'e8m0'
(scale = 2^(127 - e), the exponent rounded up so that nothing saturates). The cast
saturates; a block's amax skips its NaN elements (scaling.py's amax rule), which still
cast to NaN codes.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scaling import amax as amax_over, current_scale, e8m0_exponent, e8m0_to_float

SCALE_MODES = ("fp32", "pow2", "e8m0")


def block_grid(rows: int, cols: int, block_rows: int, block_cols: int) -> Tuple[int, int]:
    """Shape of scale_inv: whole and ragged blocks along each dimension."""
    return -(-rows // block_rows), -(-cols // block_cols)


def fp8_block_quantize(input: Tensor, block_rows: int, block_cols: int, fp8_dtype: torch.dtype, scale_mode: str,
                       amax_epsilon: float) -> Tuple[Tensor, Tensor]:
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"fp8_block_quantize: scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")
    rows, cols = input.shape
    grid_rows, grid_cols = block_grid(rows, cols, block_rows, block_cols)
    # Zero padding to whole blocks leaves every block's amax as it is.
    padded = F.pad(input.float(), (0, grid_cols * block_cols - cols, 0, grid_rows * block_rows - rows))
    blocks = padded.reshape(grid_rows, block_rows, grid_cols, block_cols)
    amax = amax_over(blocks, dim=(1, 3))  # [grid_rows, grid_cols]
    fp8_max = torch.finfo(fp8_dtype).max
    if scale_mode == "e8m0":
        scale_inv = e8m0_exponent(amax, fp8_max)
        scale = torch.reciprocal(e8m0_to_float(scale_inv))
    else:
        scale = current_scale(amax, fp8_max, amax_epsilon, power_2=scale_mode == "pow2")
        scale_inv = torch.reciprocal(scale)
    scaled = blocks * scale[:, None, :, None]
    codes = scaled.clamp(-fp8_max, fp8_max).to(fp8_dtype).reshape(padded.shape)
    return codes[:rows, :cols].contiguous(), scale_inv


def fp8_block_dequantize(data: Tensor, scale_inv: Tensor, block_rows: int, block_cols: int,
                         out_dtype: torch.dtype) -> Tensor:
    rows, cols = data.shape
    factor = e8m0_to_float(scale_inv) if scale_inv.dtype == torch.uint8 else scale_inv.float()
    per_element = factor.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]
    return (data.float() * per_element).to(out_dtype)
