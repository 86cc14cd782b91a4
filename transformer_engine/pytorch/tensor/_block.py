"""What Float8BlockQuantizer and MXFP8Quantizer share: the tensor is cast as a 2-D matrix
[prod(shape[:-1]), shape[-1]] in the scheme's row-wise blocks, and in its column-wise blocks
when the column-wise usage is wanted (fp8/block_tensor.py)."""
from typing import Hashable, Optional

from torch import Tensor

from ..constants import DType
from ..fp8.block_tensor import BlockLayout, Float8BlockPair, quantize_blocks
from ..fp8.quantized_tensor import QuantizedTensor
from .quantizer import Quantizer


class BlockScaledTensor(QuantizedTensor):
    """TE's attributes of a block-scaled tensor. _rowwise_data / _columnwise_data: the codes
    [rows, cols] of the 2-D matrix (the column-wise copy in the same orientation, its blocks
    running down the columns); _*_scale_inv: one scale per block, [row blocks, column blocks]
    (fp32, or uint8 E8M0 exponents for MXFP8), without TE's padding to swizzle tiles."""

    @property
    def _rowwise_data(self) -> Tensor:
        return self._storage.operand.rowwise.data

    @property
    def _rowwise_scale_inv(self) -> Tensor:
        return self._storage.operand.rowwise.scale_inv

    @property
    def _columnwise_data(self) -> Optional[Tensor]:
        columnwise = self._storage.operand.columnwise
        return None if columnwise is None else columnwise.data

    @property
    def _columnwise_scale_inv(self) -> Optional[Tensor]:
        columnwise = self._storage.operand.columnwise
        return None if columnwise is None else columnwise.scale_inv

    @property
    def _fp8_dtype(self) -> DType:
        return DType.of_torch(self._rowwise_data.dtype)

    @property
    def _quantizer(self) -> Quantizer:
        return self._storage.quantizer


class BlockQuantizer(Quantizer):
    block_layout: BlockLayout

    @property
    def layout(self) -> Hashable:
        return ("blocks", self.fp8_dtype, self.block_layout)

    def operand_of(self, x: Tensor) -> Float8BlockPair:
        matrix = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)  # [prod(shape[:-1]), shape[-1]]
        return quantize_blocks(matrix, self.block_layout, self.fp8_dtype, with_columnwise=self.columnwise_usage)
