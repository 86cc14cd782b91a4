"""MXFP8BlockScaling's tensors: MXFP8Quantizer casts in 1 x 32 blocks (the column-wise copy in
32 x 1), one E8M0 power-of-two scale per block (uint8 exponents), into an MXFP8Tensor."""
from typing import Union

import torch

from ..constants import DType
from ..fp8.block_tensor import BlockLayout
from ._block import BlockQuantizer, BlockScaledTensor
from .quantizer import fp8_torch_dtype

MXFP8_LAYOUT = BlockLayout((1, 32), (32, 1), "e8m0", 0.0)


class MXFP8Tensor(BlockScaledTensor):
    """A tensor stored in MXFP8's blocks (see BlockScaledTensor for its attributes)."""


class MXFP8Quantizer(BlockQuantizer):
    tensor_class = MXFP8Tensor
    block_layout = MXFP8_LAYOUT

    def __init__(self, fp8_dtype: Union[DType, torch.dtype], *, rowwise: bool = True,
                 columnwise: bool = True) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.fp8_dtype = fp8_torch_dtype(fp8_dtype, "MXFP8Quantizer")

    def serves(self, recipe) -> bool:
        return recipe.mxfp8()
