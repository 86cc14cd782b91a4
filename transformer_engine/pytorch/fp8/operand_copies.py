"""Zeros and exact copies of FP8 operands, without a cast: how a quantized parameter stays
quantized when FSDP2 shards it. fully_shard allocates each rank's (padded) shard with
new_zeros and copies the rank's chunk into it; were those two ops computed on the dequantised
values, the shard would come out a plain tensor (or, re-quantised, with codes rounded anew).
"""
import math
from typing import Optional

import torch

from .block_tensor import Float8BlockPair, Float8BlockTensor
from .codes import Float8Codes
from .nvfp4_operand import Nvfp4Pair, Nvfp4Usage


def zeros(operand, shape: torch.Size):
    """An operand of nominal `shape` in operand's scheme whose every value is 0. Per-tensor:
    zero codes under a copy of operand's scale_inv, so that codes later copied in from tensors
    sharing that scale (FSDP2's chunks of one parameter) stay exact. Block-scaled: zero codes
    and zero scales (0 in fp32 and E8M0 alike gives the value 0), in operand's usages and
    blocks, over the 2-D matrix [prod(shape[:-1]), shape[-1]]."""
    if isinstance(operand, Float8Codes):
        return Float8Codes(torch.zeros(shape, dtype=operand.data.dtype, device=operand.device),
                           operand.scale_inv.clone())
    rows, cols = (math.prod(shape[:-1]), shape[-1]) if len(shape) else (1, 1)
    if isinstance(operand, Nvfp4Pair):
        return operand.zeros(rows, cols)

    def zero_usage(usage):
        grid = (-(-rows // usage.block[0]), -(-cols // usage.block[1]))
        return Float8BlockTensor(usage.data.new_zeros(rows, cols), usage.scale_inv.new_zeros(grid), usage.block,
                                 power_of_two_scales=usage.power_of_two_scales)
    rowwise = None if operand.rowwise is None else zero_usage(operand.rowwise)
    if operand.columnwise is operand.rowwise:  # square blocks: one tensor serves both usages
        return Float8BlockPair(rowwise, rowwise)
    return Float8BlockPair(rowwise, None if operand.columnwise is None else zero_usage(operand.columnwise))


def copy_into(dst, src) -> bool:
    """Writes src's codes (and block scales) into dst's tensors in place, exactly: dst is a
    view's operand, whose tensors are slices of its base's. False (nothing written) where that
    cannot stand for a copy of the values: different schemes, formats, shapes or blocks, a
    usage dst holds and src lacks, or per-tensor codes under another scale than dst's (which
    covers the rest of the base too). The caller drops whatever the base cached from its old
    codes (a transpose)."""
    if any(isinstance(dst, scheme) != isinstance(src, scheme) for scheme in (Float8Codes, Nvfp4Pair)):
        return False
    if isinstance(dst, Nvfp4Pair):
        return _copied_nvfp4(dst, src)
    if isinstance(dst, Float8Codes):
        if dst.data.dtype != src.data.dtype or dst.data.shape != src.data.shape:
            return False
        if not torch.equal(dst.scale_inv, src.scale_inv):
            return False
        dst.data.copy_(src.data)
        return True
    pairs = [(dst.rowwise, src.rowwise), (dst.columnwise, src.columnwise)]
    if not all(_same_blocks(d, s) for d, s in pairs if d is not None):
        return False
    for d, s in pairs:
        if d is not None:
            d.data.copy_(s.data)
            d.scale_inv.copy_(s.scale_inv)
    return True


def _same_blocks(dst: Float8BlockTensor, src) -> bool:
    return (src is not None and dst.block == src.block and not dst.transposed and not src.transposed
            and dst.data.shape == src.data.shape and dst.data.dtype == src.data.dtype
            and dst.scale_inv.shape == src.scale_inv.shape and dst.scale_inv.dtype == src.scale_inv.dtype)


def _copied_nvfp4(dst: Nvfp4Pair, src: Nvfp4Pair) -> bool:
    """NVFP4 codes and scales copied usage by usage, where both are cast alike (blocks, transform,
    bound) with the same global amax (the shards of one weight's cast); a row-scaled cast's
    amaxes are its rows' and are copied with them."""
    pairs = [(d, s) for d, s in ((dst.rowwise, src.rowwise), (dst.columnwise, src.columnwise)) if d is not None]
    if not all(_same_nvfp4_cast(d, s) for d, s in pairs):
        return False
    for d, s in pairs:
        d.data.copy_(s.data)
        d.scales.copy_(s.scales)
        if d.row_scaled:
            d.amax.copy_(s.amax)
    return True


def _same_nvfp4_cast(dst: Nvfp4Usage, src: Optional[Nvfp4Usage]) -> bool:
    return (src is not None and dst.data.shape == src.data.shape and dst.scales.shape == src.scales.shape
            and (dst.cols, dst.block_rows, dst.rht, dst.e4m3_max, dst.row_scaled)
            == (src.cols, src.block_rows, src.rht, src.e4m3_max, src.row_scaled)
            and (dst.row_scaled or torch.equal(dst.amax, src.amax)))
