"""FSDP2 (torch.distributed.fsdp.fully_shard) over FP8 weights: what te.quantized_model_init's
parameters send when FSDP2 all-gathers their shards, and how the gathered weight is rebuilt.

FSDP2 shards every parameter along its first dimension and, before a module runs, all-gathers
the shards. A tensor subclass may name the tensors that travel (fsdp_pre_all_gather) and
rebuild the parameter from what arrives (fsdp_post_all_gather). Here the FP8 codes travel as
uint8, one byte per element and usage held (a quarter, or with both usages a half, of an
fp32 gather; the block scales add 1/32 or less), and the gathered weight is a quantized
tensor of the same scheme: the GEMMs take its codes as they would an unsharded FP8 weight's,
with no cast.

- Per-tensor codes (Float8Tensor): only the codes travel; the scale_inv is metadata. This is
  exact because the shards of one weight share one scale: a delayed-scaling weight is cast
  with its module's scale, which the recipe's update keeps equal over the ranks (it reduces
  the amaxes over the autocast's group, the world by default); a current-scaling weight's
  quantizer takes the amax over the shard group in every write once it knows the group
  (share_scale_over: at the first all-gather, when reset_parameters casts a DTensor, when
  FusedAdam first steps it). Writes before that (an optimizer step or a checkpoint load
  ahead of the first forward) cast each shard with its own amax: the first all-gather of a
  weight compares the shards' scales over the group and, where they differ, casts the shards
  again at the amax over all of them.
- Block-scaled codes (MXFP8Tensor, Float8BlockwiseQTensor): the codes and block scales of
  each usage held travel (both usages: the same gathered weight serves the backward's GEMMs
  whether or not FSDP2 reshards it after the forward). The gathered grid of scales is the
  whole weight's when every shard's rows are a whole number of blocks (32 rows for MXFP8's
  column-wise blocks, 128 for Float8BlockScaling's 128 x 128 or 128 x 1), which needs equal
  shards. Any other weight is refused at its first all-gather (fully_shard itself cuts it as
  values and casts each shard in blocks of its own, whose scales cannot be gathered). Over a
  shard group of one rank (HSDP with a shard dimension of 1), where FSDP2 copies the first
  tensor sent and nothing else, the tensors travel packed into one uint8 buffer.
- NVFP4 codes (NVFP4Tensor): each usage's codes and E4M3 scales, the amax as metadata
  (tensor/fsdp2_nvfp4.py).
"""
import math
import weakref
from typing import NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..custom_ops.fp8_cast import fp8_transpose
from ..fp8.block_tensor import Block, Float8BlockPair, Float8BlockTensor
from ..fp8.codes import Float8Codes
from ..fp8.nvfp4_operand import Nvfp4Pair
from ..fp8.quantized_tensor import QuantizedTensor, _Storage
from . import fsdp2_nvfp4


class PerTensorGather(NamedTuple):
    """The metadata of a per-tensor weight's gather: the shards' one scale_inv ([1] fp32)."""
    scale_inv: Tensor
    fp8_dtype: torch.dtype
    shape: torch.Size


class BlockGather(NamedTuple):
    """The metadata of a block-scaled weight's gather: per usage sent ('rowwise' /
    'columnwise'), its blocks and whether its scales are powers of two; `shared`: one tensor
    serves both usages (square blocks), sent once; `packed`: the (shape, dtype) of each tensor
    sent when they travel packed into one buffer (a group of one rank), else None."""
    usages: Tuple[Tuple[str, Block, bool], ...]
    shared: bool
    fp8_dtype: torch.dtype
    shape: torch.Size
    packed: Optional[Tuple[Tuple[torch.Size, torch.dtype], ...]]


class GatheredCodes(Float8Codes):
    """Per-tensor codes gathered by FSDP2. Their transpose (the backward's operand) and the CPU
    GEMM's packing are made for each use and not kept: the codes live in FSDP2's all-gather
    buffer, freed when it reshards, and anything kept beside them would hold an unsharded
    copy of the weight from one step to the next."""

    def t(self) -> Float8Codes:
        return Float8Codes(fp8_transpose(self.data), self.scale_inv)

    def keep_packed(self) -> "GatheredCodes":
        return self


class Fsdp2AllGather:
    """FSDP2's all-gather extension of the quantized tensor classes (Float8Tensor and the
    block-scaled ones), on the shard that each rank holds as its DTensor's local tensor."""

    def fsdp_pre_all_gather(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy):
        """(the tensors FSDP2 gathers, metadata for fsdp_post_all_gather)."""
        return pre_all_gather(self, mesh, torch.Size(orig_size))

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """(the gathered quantized weight, the tensors it holds that FSDP2 frees on resharding)."""
        return post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)


def pre_all_gather(shard: QuantizedTensor, mesh, orig_size: torch.Size):
    """What travels for a shard of the weight of shape orig_size over `mesh` (FSDP2's shard
    mesh, one dimension): per-tensor codes padded to FSDP2's shard rows (its last shards may
    be short), or each usage's block codes and scales."""
    operand = shard._storage.operand
    world = mesh.size()
    shard_rows = -(-orig_size[0] // world) if len(orig_size) else 1  # FSDP2's padded shard
    if isinstance(operand, Float8Codes):
        quantizer = shard._storage.quantizer
        if quantizer not in _SCALES_AGREED:
            quantizer.share_scale_over(mesh.get_group())
            _agree_on_scale(shard, mesh.get_group())
            _SCALES_AGREED.add(quantizer)
            operand = shard._storage.operand
        codes = operand.data.view(torch.uint8)
        if codes.shape[0] != shard_rows:
            padding = codes.new_zeros(shard_rows - codes.shape[0], *codes.shape[1:])
            codes = torch.cat([codes, padding])
        return (codes,), PerTensorGather(operand.scale_inv.clone(), operand.data.dtype, orig_size)
    if isinstance(operand, Nvfp4Pair):
        inputs, metadata = fsdp2_nvfp4.pre_all_gather(shard, mesh, orig_size)
        packed = tuple((t.shape, t.dtype) for t in inputs) if world == 1 else None
        return ((_packed(inputs),) if packed else inputs), metadata._replace(packed=packed)
    usages = _block_usages(operand)
    _check_block_shards(type(shard).__name__, usages, orig_size, world)
    inputs = tuple(t for _, usage in usages for t in (usage.data.view(torch.uint8), usage.scale_inv))
    packed = tuple((t.shape, t.dtype) for t in inputs) if world == 1 else None
    metadata = BlockGather(tuple((name, usage.block, usage.power_of_two_scales) for name, usage in usages),
                           operand.rowwise is not None and operand.rowwise is operand.columnwise,
                           operand.stored.data.dtype, orig_size, packed)
    return ((_packed(inputs),) if packed else inputs), metadata


def post_all_gather(shard: QuantizedTensor, outputs: Tuple[Tensor, ...], metadata, param_dtype: torch.dtype,
                    out: Optional[QuantizedTensor]):
    """The gathered weight, in nominal dtype param_dtype, over the all-gather outputs (each
    input's gathered copies, the ranks' shards one after the other along dimension 0); with
    `out` (the weight gathered before, from the same buffers refilled), `out` made to hold
    them. The quantizer is the shard's: the GEMMs check it serves the recipe."""
    if isinstance(metadata, PerTensorGather):
        (codes,) = outputs
        operand = GatheredCodes(codes[:metadata.shape[0]].view(metadata.fp8_dtype), metadata.scale_inv)
    elif isinstance(metadata, fsdp2_nvfp4.Nvfp4Gather):
        operand = fsdp2_nvfp4.post_all_gather(_unpacked(outputs[0], metadata.packed) if metadata.packed else outputs,
                                              metadata)
    else:
        outputs = _unpacked(outputs[0], metadata.packed) if metadata.packed else outputs
        gathered = {}
        for index, (name, block, power_of_two) in enumerate(metadata.usages):
            data, scale_inv = outputs[2 * index], outputs[2 * index + 1]
            gathered[name] = Float8BlockTensor(data.view(metadata.fp8_dtype), scale_inv, block,
                                               power_of_two_scales=power_of_two)
        rowwise = gathered.get("rowwise")
        operand = Float8BlockPair(rowwise, rowwise if metadata.shared else gathered.get("columnwise"))
    if out is not None:
        out._storage.operand = operand
        return out, ()
    weight = type(shard)._over(_Storage(operand, shard._storage.quantizer, metadata.shape), param_dtype)
    # Nothing beyond the all-gather outputs, which FSDP2 frees itself, to free on resharding.
    return weight, ()


# The quantizers of per-tensor weights whose shards have been checked to share one scale
# (at their first all-gather; every later write casts them alike).
_SCALES_AGREED: "weakref.WeakSet" = weakref.WeakSet()


def _agree_on_scale(shard: QuantizedTensor, group) -> None:
    """Brings the shards of a per-tensor weight, over `group`, to one scale: where their
    scales differ, each is cast again from its values by its quantizer (which share_scale_over
    has made take the amax over the group). Still different scales are a delayed-scaling
    weight whose module has different FP8 states on the ranks: refused."""
    if _scales_agree(shard._storage.operand.scale_inv, group):
        return
    with torch.no_grad():
        shard.quantize_(shard.dequantize())
    if not _scales_agree(shard._storage.operand.scale_inv, group):
        raise RuntimeError(f"{type(shard).__name__} under FSDP2: the shards of a weight of shard shape "
                           f"{tuple(shard.shape)} are cast with different scales on the ranks (its module's FP8 "
                           f"scaling state differs between them); FSDP2 can only gather codes of one scale")


def _scales_agree(scale_inv: Tensor, group) -> bool:
    lowest, highest = scale_inv.clone(), scale_inv.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX, group=group)
    return torch.equal(lowest, highest)


# Each tensor packed into one buffer starts at a multiple of this many bytes, so that it can be
# viewed back in its dtype.
_PACKED_ALIGNMENT = 16


def _packed(tensors: Tuple[Tensor, ...]) -> Tensor:
    """The tensors' bytes one after the other in one uint8 buffer, each padded to the alignment."""
    pieces = []
    for tensor in tensors:
        data = tensor.contiguous().view(torch.uint8).reshape(-1)
        pieces += [data, data.new_zeros(-data.numel() % _PACKED_ALIGNMENT)]
    return torch.cat(pieces)


def _unpacked(buffer: Tensor, parts) -> Tuple[Tensor, ...]:
    """The tensors of (shape, dtype) `parts` that _packed wrote into `buffer`, as views of it."""
    tensors, start = [], 0
    for shape, dtype in parts:
        nbytes = math.prod(shape) * dtype.itemsize
        tensors.append(buffer[start:start + nbytes].view(dtype).view(shape))
        start += nbytes + (-nbytes % _PACKED_ALIGNMENT)
    return tuple(tensors)


def _block_usages(operand: Float8BlockPair):
    if operand.rowwise is not None and operand.rowwise is operand.columnwise:
        return [("rowwise", operand.rowwise)]
    return [(name, usage) for name, usage in (("rowwise", operand.rowwise), ("columnwise", operand.columnwise))
            if usage is not None]


def _check_block_shards(owner: str, usages, orig_size: torch.Size, world: int) -> None:
    """Every shard a whole number of each usage's blocks, so that the shards' grids of scales,
    one after the other, are the whole weight's."""
    if len(orig_size) < 2 or orig_size[0] % world:
        raise ValueError(f"{owner} under FSDP2: a block-scaled weight of shape {tuple(orig_size)} must split into "
                         f"{world} equal shards along dimension 0 (its block scales cannot be padded); build it "
                         f"outside te.quantized_model_init otherwise")
    for name, usage in usages:
        rows = usage.data.shape[0]
        if usage.transposed or rows % usage.block[0]:
            raise ValueError(f"{owner} under FSDP2: each shard of the weight of shape {tuple(orig_size)} has {rows} "
                             f"rows, not a multiple of the {usage.block[0]}-row {name} blocks {usage.block}; "
                             f"give it a first dimension that splits into whole blocks over {world} ranks, or "
                             f"build it outside te.quantized_model_init")
