"""TransformerEngine's distributed helpers that frameworks and TE's own tests import from
transformer_engine.pytorch.distributed, with TE's signatures: the collectives return
(tensor, work handle or None), the handle only with async_op=True (torch.distributed's Work:
wait() before reading the tensor)."""
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..fp8.codes import Float8Codes
from ..tensor.float8_tensor import Float8Tensor, _PerTensorQuantizer
from ..tensor.quantizer import Quantizer
from .attributes import set_tensor_model_parallel_attributes
from .collectives import group_rank, group_size
from .gemm_split import GemmSplit


def get_distributed_world_size(group: Optional[object] = None) -> int:
    """Ranks in `group` (None: the default group); 1 without torch.distributed."""
    return group_size(group)


def get_distributed_rank(group: Optional[object] = None) -> int:
    """This process's rank in `group`; 0 without torch.distributed."""
    return group_rank(group)


def gather_along_first_dim(inp: Tensor, process_group: Optional[object], async_op: bool = False,
                           quantizer: Optional[Quantizer] = None) -> Tuple[Tensor, Optional[object]]:
    """The ranks' inp [n, ...] concatenated along dim 0 ([size * n, ...]), with the handle of the
    exchange under async_op. With a quantizer: the gathered tensor quantised by it (a
    QuantizedTensor); a per-tensor quantizer's codes are what travels (one byte per element),
    cast with the scale the ranks agree on (a current-scaling quantizer reduces its amax over its
    amax_reduction_group when with_amax_reduction is set, as TE's); other quantizers cast the
    gathered values. A quantized gather completes before it returns (its handle is None)."""
    if quantizer is not None:
        return _quantized_gather(inp, process_group, quantizer), None
    size = group_size(process_group)
    if size == 1:
        return inp, None
    out = torch.empty((size * inp.shape[0], *inp.shape[1:]), dtype=inp.dtype, device=inp.device)
    handle = dist.all_gather_into_tensor(out, inp.contiguous(), group=process_group, async_op=async_op)
    return out, handle


def _quantized_gather(inp: Tensor, group: Optional[object], quantizer: Quantizer) -> Tensor:
    if group_size(group) == 1:
        return quantizer(inp)
    if not isinstance(quantizer, _PerTensorQuantizer):
        total, _ = gather_along_first_dim(inp, group)
        return quantizer(total)
    local = quantizer.copy()
    local.set_usage(columnwise=False)
    codes = local.operand_of(inp.detach())
    gathered: Float8Codes = GemmSplit(group, "column", True).gather_operand(inp, local, codes).finish()
    transpose = gathered.t().data if quantizer.columnwise_usage and gathered.data.dim() == 2 else None
    return Float8Tensor(shape=gathered.shape, dtype=inp.dtype, data=gathered.data.view(torch.uint8),
                        fp8_scale_inv=gathered.scale_inv, fp8_dtype=gathered.data.dtype,
                        data_transpose=None if transpose is None else transpose.view(torch.uint8), quantizer=quantizer)


def reduce_scatter_along_first_dim(inp: Tensor, tp_group: Optional[object],
                                   async_op: bool = False) -> Tuple[Tensor, Optional[object]]:
    """Rank r's share [n / size, ...] of the ranks' sum of inp [n, ...], with the handle under
    async_op."""
    size = group_size(tp_group)
    if size == 1:
        return inp, None
    if inp.shape[0] % size:
        raise ValueError(f"reduce_scatter_along_first_dim: the first dimension of a tensor of shape "
                         f"{tuple(inp.shape)} does not split over {size} ranks")
    out = torch.empty((inp.shape[0] // size, *inp.shape[1:]), dtype=inp.dtype, device=inp.device)
    handle = dist.reduce_scatter_tensor(out, inp.contiguous(), group=tp_group, async_op=async_op)
    return out, handle


def allreduce(inp: Tensor, tp_group: Optional[object], async_op: bool = False) -> Tuple[Tensor, Optional[object]]:
    """The ranks' sum of inp, in place (as TE), with the handle under async_op."""
    if group_size(tp_group) == 1:
        return inp, None
    handle = dist.all_reduce(inp, group=tp_group, async_op=async_op)
    return inp, handle


def initialize_affine_weight_gpu(weight: Tensor, init_method: Callable[[Tensor], None],
                                 get_rng_state_tracker: Optional[Callable], partition_dim: int = 0, stride: int = 1,
                                 set_tp_attributes: bool = True) -> None:
    """Initialises this rank's shard of a tensor-parallel weight in the RNG tracker's stream (its
    default one; no tracker: the default generator), and marks its partition attributes."""
    if set_tp_attributes:
        set_tensor_model_parallel_attributes(weight, True, partition_dim, stride)
    if get_rng_state_tracker is None:
        init_method(weight)
        return
    with get_rng_state_tracker().fork():
        init_method(weight)


__all__ = ["get_distributed_world_size", "get_distributed_rank", "gather_along_first_dim",
           "reduce_scatter_along_first_dim", "allreduce", "initialize_affine_weight_gpu",
           "set_tensor_model_parallel_attributes"]
