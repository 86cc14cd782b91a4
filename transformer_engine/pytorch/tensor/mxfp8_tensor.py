"""MXFP8BlockScaling's tensors: MXFP8Quantizer casts in 1 x 32 blocks (the column-wise copy in
32 x 1), one E8M0 power-of-two scale per block (uint8 exponents), into an MXFP8Tensor; with
with_2d_quantization (TE main, for weights) in 32 x 32 blocks, whose codes serve both usages."""
from typing import Optional, Union

import torch
from torch import Tensor

from ..constants import DType
from ..fp8.block_tensor import BlockLayout
from ._block import BlockQuantizer, BlockScaledTensor
from .quantizer import fp8_torch_dtype

MXFP8_BLOCK = 32
MXFP8_LAYOUT = BlockLayout((1, MXFP8_BLOCK), (MXFP8_BLOCK, 1), "e8m0", 0.0)
MXFP8_2D_LAYOUT = BlockLayout((MXFP8_BLOCK, MXFP8_BLOCK), (MXFP8_BLOCK, MXFP8_BLOCK), "e8m0", 0.0)


class MXFP8Tensor(BlockScaledTensor):
    """A tensor stored in MXFP8's blocks (see BlockScaledTensor for its attributes). Cast in
    32 x 32 blocks, its scales read in TE's 1-D shapes: each block's scale repeated over its
    32 rows ([rows, ceil(cols / 32)] row-wise) or its 32 columns ([ceil(rows / 32), cols]
    column-wise)."""

    @property
    def _rowwise_scale_inv(self) -> Optional[Tensor]:
        return _te_scales(self._storage.operand.rowwise, dim=0)

    @property
    def _columnwise_scale_inv(self) -> Optional[Tensor]:
        return _te_scales(self._storage.operand.columnwise, dim=1)


def _te_scales(usage, dim: int) -> Optional[Tensor]:
    """usage's scales in TE's shape for its direction: 32 x 32 blocks' scales repeated along
    `dim` (0: over rows, 1: over columns), cut to the codes' extent."""
    if usage is None:
        return None
    if usage.block != MXFP8_2D_LAYOUT.rowwise:
        return usage.scale_inv
    return usage.scale_inv.repeat_interleave(MXFP8_BLOCK, dim=dim).narrow(dim, 0, usage.data.shape[dim])


class MXFP8Quantizer(BlockQuantizer):
    tensor_class = MXFP8Tensor
    block_layout = MXFP8_LAYOUT

    def __init__(self, fp8_dtype: Union[DType, torch.dtype], *, rowwise: bool = True,
                 columnwise: bool = True, with_2d_quantization: bool = False) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.fp8_dtype = fp8_torch_dtype(fp8_dtype, "MXFP8Quantizer")
        if not isinstance(with_2d_quantization, bool):
            raise TypeError(f"MXFP8Quantizer: with_2d_quantization must be a bool, got {with_2d_quantization!r}")
        self.with_2d_quantization = with_2d_quantization
        if with_2d_quantization:
            self.block_layout = MXFP8_2D_LAYOUT

    def serves(self, recipe) -> bool:
        return recipe.mxfp8()
