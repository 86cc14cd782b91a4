"""FSDP2's all-gather of NVFP4 weights (te.quantized_model_init under NVFP4BlockScaling): the
codes (uint8, two a byte) and E4M3 block scales of each usage held travel, an eighth of an
fp32 gather per usage and a sixteenth more for the scales; the amax, one for the whole weight,
is metadata.

The gathered codes are the whole weight's cast exactly when every shard was cast with the
whole weight's amax and its rows are whole blocks: FSDP2 cuts the weight's codes into shards
as they are (fp8/quantized_views.py, fp8/operand_copies.py), and every later write of a shard
takes the amax over the shard group (the quantizer's amax reduction, set at the first
all-gather, when shards written before with amaxes of their own are cast again at the amax
over all of them). The row-wise usage's rows are the shard's rows; the column-wise usage holds
the transpose, whose columns are the shard's rows: it travels transposed (rows of pairs of
codes, of scales) and is read back as a transposed view of the gathered buffer, which the GEMM
copies for its call alone, so that nothing beyond FSDP2's all-gather buffers holds the
gathered weight. Shards must be equal and, where a usage's blocks span rows (the column-wise
usage, 16 x 16 tiles), multiples of 16 rows; row-scaled casts (activations only) are refused.
"""
import dataclasses
import weakref
from typing import NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..fp8.nvfp4_operand import BLOCK, Nvfp4Pair, Nvfp4Usage


class Nvfp4Gather(NamedTuple):
    """The metadata of an NVFP4 weight's gather: each usage sent ('rowwise' / 'columnwise')
    with its cast and amax (a usage whose tensors are placeholders), the weight's shape;
    `packed` as in fsdp2.BlockGather."""
    usages: Tuple[Tuple[str, Nvfp4Usage], ...]
    shape: torch.Size
    packed: Optional[Tuple[Tuple[torch.Size, torch.dtype], ...]] = None


def pre_all_gather(shard, mesh, orig_size: torch.Size):
    """(the tensors an NVFP4 weight's shard sends, Nvfp4Gather)."""
    _check_shards(_usages(shard._storage.operand), orig_size, mesh.size())
    quantizer = shard._storage.quantizer
    if quantizer not in _AMAX_AGREED:
        quantizer.share_scale_over(mesh.get_group())
        _agree_on_amax(shard, mesh.get_group())
        _AMAX_AGREED.add(quantizer)
    usages = _usages(shard._storage.operand)  # the shard's operand anew: the agreement may have cast it again
    inputs = []
    for name, usage in usages:
        data, scales = usage.data, usage.scales.view(torch.uint8)
        if name == "columnwise":  # [cols, shard rows / 2] -> [shard rows / 2, cols]: gathered along its rows
            data, scales = data.t(), scales.t()
        inputs += [data.contiguous(), scales.contiguous()]
    placeholder = torch.empty(0, dtype=torch.uint8)
    metadata = Nvfp4Gather(tuple((name, dataclasses.replace(usage, data=placeholder, scales=placeholder,
                                                            amax=usage.amax.clone())) for name, usage in usages),
                           orig_size)
    return tuple(inputs), metadata


def post_all_gather(outputs: Tuple[Tensor, ...], metadata: Nvfp4Gather) -> Nvfp4Pair:
    """The gathered weight's operand over the all-gather outputs (views of them)."""
    gathered = {}
    for index, (name, cast) in enumerate(metadata.usages):
        data, scales = outputs[2 * index], outputs[2 * index + 1].view(torch.float8_e4m3fn)
        if name == "columnwise":  # [cols, rows / 2], [cols, rows / 16]; its own cols are the weight's rows, now all
            data, scales = data.t(), scales.t()
            cast = dataclasses.replace(cast, cols=metadata.shape[0])
        gathered[name] = dataclasses.replace(cast, data=data, scales=scales)
    return Nvfp4Pair(gathered.get("rowwise"), gathered.get("columnwise"))


def _usages(operand: Nvfp4Pair):
    return [(name, usage) for name, usage in (("rowwise", operand.rowwise), ("columnwise", operand.columnwise))
            if usage is not None]


# The quantizers of NVFP4 weights whose shards have been brought to one amax (at their first
# all-gather; every later write takes the amax over the group).
_AMAX_AGREED: "weakref.WeakSet" = weakref.WeakSet()


def _agree_on_amax(shard, group) -> None:
    """Where the shards' amaxes differ over `group` (shards written before the first all-gather,
    each cast with its own), each shard is cast again from its values at the amax over all of
    them (share_scale_over has made the quantizer reduce it)."""
    if _amaxes_agree(shard._storage.operand, group):
        return
    with torch.no_grad():
        shard.quantize_(shard.dequantize())


def _amaxes_agree(operand: Nvfp4Pair, group) -> bool:
    amax = operand.stored.amax.float().reshape(-1)[:1]
    lowest, highest = amax.clone(), amax.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX, group=group)
    return torch.equal(lowest, highest)


def _check_shards(usages, orig_size: torch.Size, world: int) -> None:
    """Equal shards of whole blocks, one amax each: what makes the gathered scales the whole weight's."""
    if len(orig_size) < 2 or orig_size[0] % world:
        raise ValueError(f"NVFP4Tensor under FSDP2: a weight of shape {tuple(orig_size)} must split into {world} "
                         f"equal shards along dimension 0 (its block scales cannot be padded); build it outside "
                         f"te.quantized_model_init otherwise")
    for name, usage in usages:
        if usage.row_scaled:
            raise ValueError(f"NVFP4Tensor under FSDP2: the {name} usage of the weight of shape {tuple(orig_size)} is "
                             f"row-scaled (an amax per row, for activations); FSDP2 gathers weights of one amax")
        shard_rows = usage.cols if name == "columnwise" else usage.data.shape[0]
        if (name == "columnwise" or usage.block_rows > 1) and shard_rows % BLOCK:
            raise ValueError(f"NVFP4Tensor under FSDP2: each shard of the weight of shape {tuple(orig_size)} has "
                             f"{shard_rows} rows, not a multiple of the 16 rows its {name} blocks span; give it a "
                             f"first dimension that splits into multiples of 16 over {world} ranks, or build it "
                             f"outside te.quantized_model_init")
