"""TE main's HybridQuantizer: one tensor, two quantizers, one per usage. The row-wise usage
(read by GEMMs contracting the last dimension: the forward's) is rowwise_quantizer's cast, the
column-wise usage (the backward's dgrad and wgrad GEMMs) columnwise_quantizer's, from the tensor
itself (columnwise_source="original") or from the row-wise cast's values
("rowwise_dequantized"). Either may be an IdentityQuantizer (that direction in high
precision). The GEMMs read the usage they contract (fp8/high_precision_operand.py, HybridPair);
operands of schemes no kernel multiplies together meet in mixed_gemm (fp8/gemm.py)."""
from typing import Optional

import torch
from torch import Tensor

from ..fp8.high_precision_operand import HybridPair
from ..fp8.quantized_tensor import QuantizedTensor
from ._usages import HeldUsages
from .quantizer import Quantizer
from .requests import QuantizerRequest

COLUMNWISE_SOURCES = ("original", "rowwise_dequantized")


class HybridQuantizedTensor(HeldUsages, QuantizedTensor):
    """A tensor a HybridQuantizer cast: `_rowwise_storage` and `_columnwise_storage` are each
    usage as its own quantizer's tensor (None where not cast)."""

    @property
    def _rowwise_storage(self) -> Optional[QuantizedTensor]:
        return self._usage_tensor("rowwise")

    @property
    def _columnwise_storage(self) -> Optional[QuantizedTensor]:
        return self._usage_tensor("columnwise")

    _data_tensor_names = ("_rowwise_storage", "_columnwise_storage")

    def _usage_tensor(self, usage: str) -> Optional[QuantizedTensor]:
        storage = self._storage
        operand = getattr(storage.operand, usage)
        if operand is None:
            return None
        quantizer = getattr(storage.quantizer, f"{usage}_quantizer")
        return quantizer.tensor_of(operand, storage.shape, self.dtype)

    @property
    def fp8_dtype(self) -> Optional[torch.dtype]:
        return self._storage.quantizer.rowwise_quantizer.fp8_dtype



class HybridQuantizer(Quantizer):
    """rowwise_quantizer / columnwise_quantizer: two distinct quantizers (each is pinned to its
    usage, so the HybridQuantizer owns them); columnwise_source: 'original' or
    'rowwise_dequantized'."""
    tensor_class = HybridQuantizedTensor

    def __init__(self, *, rowwise_quantizer: Quantizer, columnwise_quantizer: Quantizer,
                 columnwise_source: str = "original") -> None:
        super().__init__(rowwise=True, columnwise=True)
        for usage, quantizer in (("rowwise", rowwise_quantizer), ("columnwise", columnwise_quantizer)):
            if isinstance(quantizer, QuantizerRequest):
                raise TypeError(f"HybridQuantizer: the {usage} quantizer is a {type(quantizer).__name__}; a request "
                                f"(delayed scaling's shared state) is taken as a factory's whole answer only, not "
                                f"inside a HybridQuantizer")
            if not isinstance(quantizer, Quantizer):
                raise TypeError(f"HybridQuantizer: {usage}_quantizer must be a Quantizer, got "
                                f"{type(quantizer).__name__}")
        if rowwise_quantizer is columnwise_quantizer:
            raise ValueError("HybridQuantizer: rowwise_quantizer and columnwise_quantizer must be distinct objects "
                             "(each is pinned to its usage)")
        if columnwise_source not in COLUMNWISE_SOURCES:
            raise ValueError(f"HybridQuantizer: columnwise_source must be one of {COLUMNWISE_SOURCES}, got "
                             f"{columnwise_source!r}")
        rowwise_quantizer.set_usage(rowwise=True, columnwise=False)
        columnwise_quantizer.set_usage(rowwise=False, columnwise=True)
        self.rowwise_quantizer, self.columnwise_quantizer = rowwise_quantizer, columnwise_quantizer
        self.columnwise_source = columnwise_source

    def __repr__(self) -> str:
        return (f"HybridQuantizer(rowwise_quantizer={self.rowwise_quantizer!r}, columnwise_quantizer="
                f"{self.columnwise_quantizer!r}, columnwise_source={self.columnwise_source!r}, "
                f"rowwise={self.rowwise_usage}, columnwise={self.columnwise_usage})")

    def copy(self) -> "HybridQuantizer":
        """A copy with copies of both sub-quantizers (each still pinned), usages kept."""
        clone = HybridQuantizer(rowwise_quantizer=self.rowwise_quantizer.copy(),
                                columnwise_quantizer=self.columnwise_quantizer.copy(),
                                columnwise_source=self.columnwise_source)
        clone.set_usage(rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        clone.internal = self.internal
        return clone

    @property
    def fp8_dtype(self) -> Optional[torch.dtype]:
        return self.rowwise_quantizer.fp8_dtype

    @property
    def layout(self):
        return ("hybrid", self.rowwise_quantizer.layout, self.columnwise_quantizer.layout, self.columnwise_source)

    def operand_of(self, x: Tensor) -> HybridPair:
        rowwise = self.rowwise_quantizer.operand_of(x) if self.rowwise_usage else None
        columnwise = None
        if self.columnwise_usage:
            source = x
            if self.columnwise_source == "rowwise_dequantized":
                cast = rowwise if rowwise is not None else self.rowwise_quantizer.operand_of(x)
                source = cast.dequantize(x.dtype).reshape(x.shape)
            columnwise = self.columnwise_quantizer.operand_of(source)
        return HybridPair(rowwise, columnwise)

    def serves(self, recipe) -> bool:
        return recipe.custom()
