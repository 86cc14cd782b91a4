"""TE main's IdentityQuantizer: a "quantizer" that keeps the tensor in high precision (its own
dtype, or `dtype` when given), so that a CustomRecipe factory can leave chosen tensors (or, as
one half of a HybridQuantizer, chosen directions) unquantized. The GEMMs multiply such an
operand in its dtype (fp8/gemm.py, mixed_gemm): two of them are the module's own
high-precision GEMM, bit for bit."""
from typing import Optional

import torch
from torch import Tensor

from ..fp8.high_precision_operand import HighPrecisionOperand
from ..fp8.quantized_tensor import QuantizedTensor
from .quantizer import Quantizer


class IdentityTensor(QuantizedTensor):
    """A tensor an IdentityQuantizer kept: `_hp_data` holds its values as a 2-D matrix [rows,
    cols] (one buffer serves both usages)."""
    _data_tensor_names = ("_hp_data", "_hp_data")

    @property
    def _hp_data(self) -> Tensor:
        return self._storage.operand.values

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self._storage.operand.values.dtype

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None) -> None:
        """One buffer serves both usages: nothing to drop or make."""

    def get_usages(self) -> dict:
        return {"rowwise": True, "columnwise": True}


class IdentityQuantizer(Quantizer):
    """dtype: the kept values' dtype (None: the input's). rowwise / columnwise: the usages asked
    for (TE's interface; the one buffer serves both)."""
    tensor_class = IdentityTensor
    dtype: Optional[torch.dtype] = None  # TE's attribute (the base's te.DType property does not apply)

    def __init__(self, *, dtype: Optional[torch.dtype] = None, rowwise: bool = True, columnwise: bool = True) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point
                                      and dtype.itemsize > 1):
            raise ValueError(f"IdentityQuantizer: dtype must be a high-precision floating dtype or None, got "
                             f"{dtype!r}")
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"IdentityQuantizer(dtype={self.dtype}, rowwise={self.rowwise_usage}, columnwise={self.columnwise_usage})"

    @property
    def fp8_dtype(self) -> Optional[torch.dtype]:  # the kept dtype: there is no FP8 format
        return self.dtype

    @property
    def layout(self):
        return ("identity", self.dtype)

    def operand_of(self, x: Tensor) -> HighPrecisionOperand:
        matrix = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)  # [prod(shape[:-1]), shape[-1]]
        return HighPrecisionOperand(matrix if self.dtype is None else matrix.to(self.dtype))

    def serves(self, recipe) -> bool:
        return recipe.custom()
