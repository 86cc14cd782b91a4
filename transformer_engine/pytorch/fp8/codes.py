"""Float8Codes: FP8 codes plus the inverse scale that dequantises them."""
import dataclasses
from typing import Optional

import torch
from torch import Tensor

from .._extension import kernels
from ..custom_ops.fp8_cast import fp8_dequantize, fp8_quantize, fp8_quantize_transpose, fp8_transpose
from ..custom_ops.scaled_gemm import pack_operand


@dataclasses.dataclass
class Float8Codes:
    """data: FP8 codes (float8_e4m3fn / float8_e5m2), any shape; scale_inv: float32 [1], so
    that the value is data * scale_inv. The transpose of a 2-D tensor is cached on first use
    (the wgrad GEMM of a Linear needs both layouts of its operands)."""
    data: Tensor
    scale_inv: Tensor
    _transpose: Optional["Float8Codes"] = dataclasses.field(default=None, repr=False)

    @classmethod
    def quantize(cls, x: Tensor, scale: Tensor, fp8_dtype: torch.dtype,
                 with_transpose: bool = False) -> "tuple[Float8Codes, Tensor]":
        """(saturate(x * scale) as FP8, max |x|); scale is float32 [1]. with_transpose: x is
        2-D and its transpose is written in the same pass (and cached)."""
        scale_inv = torch.reciprocal(scale.reshape(1).float())
        if not with_transpose:
            data, amax = fp8_quantize(x, scale, fp8_dtype)
            return cls(data, scale_inv), amax
        data, data_t, amax = fp8_quantize_transpose(x, scale, fp8_dtype)
        return cls(data, scale_inv, Float8Codes(data_t, scale_inv)), amax

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def as_uint8(self) -> Tensor:
        """The codes viewed as uint8 (TE's storage dtype): one view object for as long as these
        codes are held, so that code comparing TE's attributes by identity sees one tensor.
        Kept beside the fields, not as one: a replace() of this operand starts without it."""
        memo = self.__dict__.get("_uint8_view")
        if memo is None or memo[0] is not self.data:
            memo = self.__dict__["_uint8_view"] = (self.data, self.data.view(torch.uint8))
        return memo[1]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return fp8_dequantize(self.data, self.scale_inv, dtype)

    def t(self) -> "Float8Codes":
        """[m, n] -> [n, m], computed once and kept."""
        if self._transpose is None:
            self._transpose = Float8Codes(fp8_transpose(self.data), self.scale_inv)
        return self._transpose

    def rows(self, start: int, stop: int) -> "Float8Codes":
        """Rows [start, stop) of 2-D codes [m, n], with the same scale (a view of the codes)."""
        return Float8Codes(self.data[start:stop], self.scale_inv)

    def keep_packed(self) -> "Float8Codes":
        """Marks these codes as a GEMM's b that serves many GEMMs (a weight the module keeps
        across microbatches): the CPU kernel's packing of them is then made once and kept
        (packed_for_cpu_gemm), at 2 bytes per code, for as long as these codes are. Returns self."""
        self.__dict__["_keep_packed"] = True
        return self

    def packed_for_cpu_gemm(self) -> Optional[Tensor]:
        """scaled_gemm's b_packed for these codes where they are kept packed (keep_packed) on the
        CPU, else None. Packed again when the codes change in place (their version counter) or
        the CPU tier does; never while torch.compile traces (the packing is not an op)."""
        if not self.__dict__.get("_keep_packed") or self.data.device.type != "cpu" or torch.compiler.is_compiling():
            return None
        key = (self.data._version, kernels.active_cpu_isa())
        memo = self.__dict__.get("_packed")
        if memo is None or memo[0] != key:
            memo = self.__dict__["_packed"] = (key, pack_operand(self.data))
        return memo[1]

    def saved(self) -> "tuple[tuple[Tensor, ...], type]":
        """(tensors for ctx.save_for_backward, a function rebuilding self from them)."""
        return (self.data, self.scale_inv), Float8Codes
