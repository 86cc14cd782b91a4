"""What Float8BlockQuantizer and MXFP8Quantizer share: the tensor is cast as a 2-D matrix
[prod(shape[:-1]), shape[-1]] in the scheme's row-wise blocks, and in its column-wise blocks
when the column-wise usage is wanted (fp8/block_tensor.py)."""
import dataclasses
from typing import Hashable, Optional

from torch import Tensor

from ..constants import DType
from ..fp8.block_tensor import BlockLayout, Float8BlockPair, Float8BlockTensor, quantize_blocks
from ..fp8.quantized_tensor import QuantizedTensor
from ._usages import HeldUsages
from .fsdp2 import Fsdp2AllGather
from .quantizer import Quantizer


class BlockScaledTensor(HeldUsages, Fsdp2AllGather, QuantizedTensor):
    """TE's attributes of a block-scaled tensor (under FSDP2, its codes and block scales are what
    the shards gather: tensor/fsdp2.py). _rowwise_data / _columnwise_data: the codes
    [rows, cols] of the 2-D matrix (the column-wise copy in the same orientation, its blocks
    running down the columns); _*_scale_inv: one scale per block, [row blocks, column blocks]
    (fp32, or uint8 E8M0 exponents for MXFP8), without TE's padding to swizzle tiles."""

    @property
    def _rowwise_data(self) -> Optional[Tensor]:
        rowwise = self._storage.operand.rowwise
        return None if rowwise is None else rowwise.data

    @_rowwise_data.setter
    def _rowwise_data(self, codes: Optional[Tensor]) -> None:
        """Drops (None) or replaces the row-wise codes."""
        self._storage.operand.rowwise = _with_data(self._storage.operand.rowwise, codes,
                                                   f"{type(self).__name__}._rowwise_data")

    @property
    def _rowwise_scale_inv(self) -> Optional[Tensor]:
        rowwise = self._storage.operand.rowwise
        return None if rowwise is None else rowwise.scale_inv

    @property
    def _columnwise_data(self) -> Optional[Tensor]:
        columnwise = self._storage.operand.columnwise
        return None if columnwise is None else columnwise.data

    @_columnwise_data.setter
    def _columnwise_data(self, codes: Optional[Tensor]) -> None:
        self._storage.operand.columnwise = _with_data(self._storage.operand.columnwise, codes,
                                                      f"{type(self).__name__}._columnwise_data")

    @property
    def _columnwise_scale_inv(self) -> Optional[Tensor]:
        columnwise = self._storage.operand.columnwise
        return None if columnwise is None else columnwise.scale_inv

    @property
    def _fp8_dtype(self) -> DType:
        return DType.of_torch(self._storage.operand.stored.data.dtype)

    @property
    def _quantizer(self) -> Quantizer:
        return self._storage.quantizer


def _with_data(usage: Optional[Float8BlockTensor], codes: Optional[Tensor], name: str) -> Optional[Float8BlockTensor]:
    """The usage with `codes` (FP8 or TE's uint8, the held codes' shape) in place of its codes,
    viewed as the held FP8 format; None drops it (CPU offloading). Codes for a usage not held
    are refused: there are no scales to go with them."""
    if codes is None:
        return None
    if usage is None:
        raise RuntimeError(f"{name}: that usage is not held, so there are no block scales for these codes "
                           f"(quantize with it)")
    if codes.element_size() != 1 or codes.shape != usage.data.shape:
        raise ValueError(f"{name}: codes must be one byte each, {tuple(usage.data.shape)}: got {codes.dtype} "
                         f"{tuple(codes.shape)}")
    return dataclasses.replace(usage, data=codes.view(usage.data.dtype))


class BlockQuantizer(Quantizer):
    block_layout: BlockLayout

    @property
    def layout(self) -> Hashable:
        return ("blocks", self.fp8_dtype, self.block_layout)

    def operand_of(self, x: Tensor) -> Float8BlockPair:
        matrix = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)  # [prod(shape[:-1]), shape[-1]]
        return quantize_blocks(matrix, self.block_layout, self.fp8_dtype, with_columnwise=self.columnwise_usage,
                               with_rowwise=self.rowwise_usage)
