"""Block-scaled FP8 tensors (Float8BlockScaling and MXFP8BlockScaling) and the block layouts
each recipe uses for each GEMM operand.

A GEMM contracts over one dimension, and every scale block must lie along it. y = x W^T
contracts over the input features, dgrad dx = dy W over the output features, wgrad
dW = dy^T x over the tokens; so each operand is quantised "row-wise" (blocks along its last
dimension) for one GEMM and "column-wise" (blocks along its first dimension) for another,
except 128 x 128 blocks, which serve both.
"""
import dataclasses
import functools
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ..custom_ops.fp8_block import fp8_block_dequantize, fp8_block_quantize
from ..custom_ops.fp8_cast import fp8_transpose

Block = Tuple[int, int]


@dataclasses.dataclass
class Float8BlockTensor:
    """data: FP8 codes [rows, cols]; scale_inv: one per block of block = (rows, cols) elements,
    [ceil(rows / block[0]), ceil(cols / block[1])], float32 or uint8 E8M0 exponents. The
    value is data * scale_inv of each element's block; `transposed` marks a view of its
    transpose (the codes are moved only where they are dequantised: the CPU GEMM's operands). power_of_two_scales:
    every scale_inv is a power of two (E8M0, or scale_mode 'pow2'), so each value
    code * scale_inv is exact in bf16 and fp32."""
    data: Tensor
    scale_inv: Tensor
    block: Block
    transposed: bool = False
    power_of_two_scales: bool = False

    @classmethod
    def quantize(cls, x: Tensor, block: Block, fp8_dtype: torch.dtype, scale_mode: str,
                 amax_epsilon: float = 0.0) -> "Float8BlockTensor":
        data, scale_inv = fp8_block_quantize(x, block, fp8_dtype, scale_mode, amax_epsilon)
        return cls(data, scale_inv, block, power_of_two_scales=scale_mode != "fp32")

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def shape(self) -> torch.Size:
        return self.data.shape[::-1] if self.transposed else self.data.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The values, contiguous. A transposed view's codes and block grid are transposed
        first (one byte a code), the same values element for element: [4096, 4096] E4M3 to bf16
        in 16 ms on 2 Xeon cores, where dequantising and then copying the transposed bf16 values
        took 41 ms."""
        if not self.transposed:
            return fp8_block_dequantize(self.data, self.scale_inv, self.block, dtype)
        scale_inv_t = self.scale_inv.t().contiguous()  # [ceil(cols / b1), ceil(rows / b0)]
        return fp8_block_dequantize(fp8_transpose(self.data), scale_inv_t, self.block[::-1], dtype)

    def t(self) -> "Float8BlockTensor":
        return dataclasses.replace(self, transposed=not self.transposed)

    def rows(self, start: int, stop: int) -> "Float8BlockTensor":
        """Rows [start, stop) with their blocks' scales (views); start must begin a block row."""
        height = self.block[0]
        if self.transposed or start % height:
            raise ValueError(f"Float8BlockTensor.rows: rows [{start}, {stop}) of a tensor of shape {tuple(self.shape)} "
                             f"in {self.block} blocks{' (a transposed view)' if self.transposed else ''} "
                             f"do not start a block row")
        return dataclasses.replace(self, data=self.data[start:stop],
                                   scale_inv=self.scale_inv[start // height:-(-stop // height)])

    def saved(self) -> Tuple[Tuple[Tensor, ...], Callable[..., "Float8BlockTensor"]]:
        """(tensors for ctx.save_for_backward, a function rebuilding self from them)."""
        return (self.data, self.scale_inv), functools.partial(_rebuild, self.block, self.transposed,
                                                              self.power_of_two_scales)


def _rebuild(block: Block, transposed: bool, power_of_two_scales: bool, data: Tensor,
             scale_inv: Tensor) -> Float8BlockTensor:
    return Float8BlockTensor(data, scale_inv, block, transposed, power_of_two_scales)


class UsagePair:
    """What an operand held in two usages (dataclass fields `rowwise` and `columnwise`, either
    None) answers the same way whatever its scheme: the usage stored, and its device."""

    @property
    def stored(self):
        return self.rowwise if self.rowwise is not None else self.columnwise

    @property
    def device(self) -> torch.device:
        return self.stored.device


@dataclasses.dataclass
class Float8BlockPair(UsagePair):
    """One operand in both usages: `rowwise` for the GEMM contracting its last dimension,
    `columnwise` (None when no later GEMM needs it) for the one contracting its first; a
    quantizer asked for the column-wise usage alone leaves `rowwise` None. t() is the
    transposed operand, blocks along what becomes its last dimension."""
    rowwise: Optional[Float8BlockTensor]
    columnwise: Optional[Float8BlockTensor]

    @property
    def shape(self) -> torch.Size:
        return self.stored.shape

    @property
    def power_of_two_scales(self) -> bool:
        return self.stored.power_of_two_scales

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.stored.dequantize(dtype)

    def rows(self, start: int, stop: int) -> "Float8BlockPair":
        """Rows [start, stop) for the GEMM contracting the last dimension (the row-wise codes)."""
        return Float8BlockPair(self.rowwise.rows(start, stop), None)

    def t(self) -> Float8BlockTensor:
        if self.columnwise is None:
            raise RuntimeError("this FP8 operand was quantised for the forward GEMM only (no column-wise copy)")
        return self.columnwise.t()


class BlockLayout(NamedTuple):
    rowwise: Block
    columnwise: Block
    scale_mode: str  # 'fp32', 'pow2' or 'e8m0' (fp8_block_quantize)
    amax_epsilon: float


def quantize_blocks(x: Tensor, layout: BlockLayout, fp8_dtype: torch.dtype, with_columnwise: bool,
                    with_rowwise: bool = True) -> Float8BlockPair:
    """x [rows, cols] in the layout's row-wise blocks, and in its column-wise ones when asked
    (square blocks: the same codes serve both); with_rowwise=False keeps the column-wise
    ones alone."""
    if not with_rowwise:
        columnwise = Float8BlockTensor.quantize(x, layout.columnwise, fp8_dtype, layout.scale_mode,
                                                layout.amax_epsilon)
        return Float8BlockPair(None, columnwise)
    rowwise = Float8BlockTensor.quantize(x, layout.rowwise, fp8_dtype, layout.scale_mode, layout.amax_epsilon)
    if not with_columnwise:
        return Float8BlockPair(rowwise, None)
    if layout.columnwise == layout.rowwise:
        return Float8BlockPair(rowwise, rowwise)
    columnwise = Float8BlockTensor.quantize(x, layout.columnwise, fp8_dtype, layout.scale_mode, layout.amax_epsilon)
    return Float8BlockPair(rowwise, columnwise)
