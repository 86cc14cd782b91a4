"""A GEMM operand kept in high precision (IdentityQuantizer's, TE main), and HybridPair: an
operand whose two usages come from two quantizers (HybridQuantizer's: e.g. MXFP8 codes for
the forward GEMM, NVFP4 codes for the weight-gradient GEMM).

Both answer what the GEMMs and the modules ask of any FP8 operand: shape, device, t() (the
operand for a GEMM contracting the first dimension: the column-wise usage), rows(),
dequantize(); the high-precision operand, as a usage, saved() (tensors for
ctx.save_for_backward and a function rebuilding it)."""
import dataclasses
from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor

from .block_tensor import UsagePair


@dataclasses.dataclass
class HighPrecisionOperand:
    """values: the tensor itself (a 2-D [rows, cols] matrix for the GEMMs), no encoding."""
    values: Tensor

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        return self.values if dtype is None else self.values.to(dtype)

    def t(self) -> "HighPrecisionOperand":
        return HighPrecisionOperand(self.values.t())

    def rows(self, start: int, stop: int) -> "HighPrecisionOperand":
        return HighPrecisionOperand(self.values[start:stop])

    def saved(self) -> Tuple[Tuple[Tensor, ...], Callable[..., "HighPrecisionOperand"]]:
        return (self.values,), HighPrecisionOperand


@dataclasses.dataclass
class HybridPair(UsagePair):
    """rowwise: the operand of the row-wise quantizer (None when not cast), read by GEMMs
    contracting the last dimension; columnwise: the column-wise quantizer's (its t() is the
    transposed operand), None when not cast."""
    rowwise: Optional[Any]
    columnwise: Optional[Any]

    @property
    def shape(self) -> torch.Size:
        return self.stored.shape

    def forward_usage(self):
        if self.rowwise is None:
            raise RuntimeError("this hybrid operand holds no row-wise usage (its quantizer was asked for the "
                               "column-wise one alone)")
        return self.rowwise

    def t(self):
        if self.columnwise is None:
            raise RuntimeError("this hybrid operand was cast for the forward GEMM only (no column-wise usage)")
        return self.columnwise.t()

    def rows(self, start: int, stop: int) -> "HybridPair":
        return HybridPair(self.forward_usage().rows(start, stop), None)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.stored.dequantize(dtype)
