"""NVFP4 operands (NVFP4BlockScaling): a tensor's 2-D matrix [rows, cols] = [prod(shape[:-1]),
shape[-1]] cast to E2M1 codes with E4M3 block scales and an fp32 amax (reference/nvfp4.py has
the numerics), once per usage.

A GEMM contracts over one dimension and the 16-value blocks must run along it: the row-wise
usage holds the matrix's codes (blocks along its rows), the column-wise usage the codes of its
transpose [cols, rows] (blocks along the matrix's columns), for the GEMM that contracts the
rows (the weight gradient's). Each usage carries its own amax: TE computes the column-wise one
after the random Hadamard transform where the recipe applies it (the column-wise operands of
the weight-gradient GEMM), whose codes are then those of the transformed values.
"""
import dataclasses
import functools
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..custom_ops.nvfp4 import nvfp4_amax, nvfp4_dequantize, nvfp4_quantize, nvfp4_transpose_tiles
from ..reference import nvfp4 as reference
from .block_tensor import UsagePair

BLOCK = reference.BLOCK  # values a block scale serves, along the contraction

class Nvfp4Casts(NamedTuple):
    """The amax, cast and tile-transpose functions (reference/nvfp4.py's signatures) a cast runs on."""
    amax: Callable[..., Tensor]
    quantize: Callable[..., Tuple[Tensor, Tensor]]
    transpose_tiles: Callable[..., Tuple[Tensor, Tensor]]


# The ops (the CPU kernel, the Triton kernels or the reference on accelerators), and plain
# PyTorch (TE's reference quantizer).
KERNELS = Nvfp4Casts(nvfp4_amax, nvfp4_quantize, nvfp4_transpose_tiles)
REFERENCE = Nvfp4Casts(reference.nvfp4_amax, reference.nvfp4_quantize, reference.nvfp4_transpose_tiles)


@dataclasses.dataclass(frozen=True)
class Nvfp4Cast:
    """How a usage is cast (nvfp4_quantize's options): block_rows 1 (1 x 16 blocks) or 16
    (16 x 16 tiles), the random Hadamard transform, e4m3_max (the global scale's bound, 448 or
    4over6's 256), four_over_six ('off', 'mae' or 'mse') with its error measured scaled
    (scaled_error), one amax per row (row_scaled)."""
    block_rows: int = 1
    rht: bool = False
    e4m3_max: int = 448
    four_over_six: str = "off"
    scaled_error: bool = False
    row_scaled: bool = False

    @property
    def tiles_transpose(self) -> bool:
        """Whether this cast's codes of a matrix, transposed, are its codes of the transpose
        (with nearest rounding and the same amax): 16 x 16 tiles hold the same values either
        way. Not with the transform (along the rows only) or 4over6 (a tile's errors summed
        in its rows' order)."""
        return self.block_rows == BLOCK and not self.rht and self.four_over_six == "off" and not self.row_scaled


@dataclasses.dataclass
class Nvfp4Usage:
    """One usage's codes: data uint8 [rows, ceil(cols / 2)] (two codes a byte, the even column
    in the low nibble), scales float8_e4m3fn [rows, ceil(cols / 16)] (a 16 x 16 tile's scale on
    each of its rows when block_rows is 16), amax fp32 [1] (the cast's global amax) or [rows]
    (row-scaled), cols (the matrix's columns, for ragged widths), rht (the codes are of the
    transformed values), e4m3_max (the global scale's bound the cast used), row_scaled (amax
    holds one value per row)."""
    data: Tensor
    scales: Tensor
    amax: Tensor
    cols: int
    block_rows: int = 1
    rht: bool = False
    e4m3_max: int = 448
    row_scaled: bool = False

    @classmethod
    def quantize(cls, matrix: Tensor, cast: Nvfp4Cast, transpose: bool, sr_rng: Optional[Tensor], amax: Tensor,
                 casts: Nvfp4Casts = KERNELS) -> "Nvfp4Usage":
        """matrix [rows, cols] (or its transpose when `transpose`) cast with the global `amax`
        (casts.amax's of the same options, or that reduced over ranks)."""
        data, scales = casts.quantize(matrix, amax, cast.block_rows, transpose, cast.rht, sr_rng, cast.e4m3_max,
                                      cast.four_over_six, cast.scaled_error)
        cols = matrix.shape[0] if transpose else matrix.shape[1]
        return cls(data, scales, amax, cols, cast.block_rows, cast.rht, cast.e4m3_max, cast.row_scaled)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.data.shape[0], self.cols))

    def transposed(self, casts: Nvfp4Casts = KERNELS) -> "Nvfp4Usage":
        """The usage of the transpose, from these codes: the same bits as casting it, where
        the cast's tiles_transpose holds and it rounded to nearest."""
        data, scales = casts.transpose_tiles(self.data, self.scales, self.cols)
        return dataclasses.replace(self, data=data, scales=scales, cols=self.data.shape[0])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The values [rows, cols] (a transformed usage's transformed back, in fp32 first)."""
        if not self.rht:
            return nvfp4_dequantize(self.data, self.scales, self.amax, self.cols, dtype, self.e4m3_max)
        values = nvfp4_dequantize(self.data, self.scales, self.amax, self.cols, torch.float32, self.e4m3_max)
        return reference.inverse_rht16(values).to(dtype)

    def saved(self) -> Tuple[Tuple[Tensor, ...], Callable[..., "Nvfp4Usage"]]:
        """(tensors for ctx.save_for_backward, a function rebuilding self from them)."""
        return (self.data, self.scales, self.amax), functools.partial(_rebuild, self.cols, self.block_rows, self.rht,
                                                                      self.e4m3_max, self.row_scaled)


def _rebuild(cols: int, block_rows: int, rht: bool, e4m3_max: int, row_scaled: bool, data: Tensor, scales: Tensor,
             amax: Tensor) -> Nvfp4Usage:
    return Nvfp4Usage(data, scales, amax, cols, block_rows, rht, e4m3_max, row_scaled)


@dataclasses.dataclass
class Nvfp4Pair(UsagePair):
    """One operand in both usages (None where not cast): `rowwise` of the matrix [rows, cols],
    `columnwise` of its transpose."""
    rowwise: Optional[Nvfp4Usage]
    columnwise: Optional[Nvfp4Usage]

    @property
    def shape(self) -> torch.Size:
        """The matrix's [rows, cols]."""
        if self.rowwise is not None:
            return self.rowwise.shape
        return torch.Size(reversed(self.columnwise.shape))

    def t(self) -> Nvfp4Usage:
        """The transposed operand [cols, rows], blocks along the matrix's rows: the column-wise usage."""
        if self.columnwise is None:
            raise RuntimeError("this NVFP4 operand was cast for the forward GEMM only (no column-wise codes)")
        return self.columnwise

    def cuts_at_blocks(self, first: int, stop: int) -> bool:
        """Whether rows [first, stop) of the matrix start and end on the blocks of every usage
        held: 16 rows for the column-wise usage (its blocks run along the matrix's rows) and for
        16 x 16 tiles; any row for 1 x 16 row-wise blocks alone. The last row ends a block."""
        spans_rows = self.columnwise is not None or self.rowwise.block_rows > 1
        return not spans_rows or (first % BLOCK == 0 and (stop % BLOCK == 0 or stop == self.shape[0]))

    def rows(self, first: int, stop: int) -> "Nvfp4Pair":
        """Rows [first, stop) of the matrix (cuts_at_blocks), as views of this pair's tensors:
        the row-wise usage's rows (and a row-scaled cast's amaxes), the column-wise usage's
        columns, two codes a byte and a scale per 16."""
        rowwise = columnwise = None
        if self.rowwise is not None:
            held = self.rowwise
            rowwise = dataclasses.replace(held, data=held.data[first:stop], scales=held.scales[first:stop],
                                          amax=held.amax[first:stop] if held.row_scaled else held.amax)
        if self.columnwise is not None:
            held = self.columnwise
            columnwise = dataclasses.replace(held, data=held.data[:, first // 2:-(-stop // 2)],
                                             scales=held.scales[:, first // BLOCK:-(-stop // BLOCK)],
                                             cols=stop - first)
        return Nvfp4Pair(rowwise, columnwise)

    def zeros(self, rows: int, cols: int) -> "Nvfp4Pair":
        """The matrix [rows, cols] in this pair's usages and casts with every code and scale zero
        (the value 0) and copies of its amaxes, so that codes later copied in from this cast stay
        exact (FSDP2's shard of a weight, into which its rows are copied)."""
        def zero(usage: Optional[Nvfp4Usage], usage_rows: int, usage_cols: int) -> Optional[Nvfp4Usage]:
            if usage is None:
                return None
            amax = usage.amax.new_zeros(usage_rows) if usage.row_scaled else usage.amax.clone()
            return dataclasses.replace(usage, data=usage.data.new_zeros(usage_rows, -(-usage_cols // 2)),
                                       scales=usage.scales.new_zeros(usage_rows, -(-usage_cols // BLOCK)), amax=amax,
                                       cols=usage_cols)
        return Nvfp4Pair(zero(self.rowwise, rows, cols), zero(self.columnwise, cols, rows))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The matrix's values [rows, cols]: the row-wise usage's, else the column-wise one's transposed."""
        if self.rowwise is not None:
            return self.rowwise.dequantize(dtype)
        return self.columnwise.dequantize(dtype).t().contiguous()
