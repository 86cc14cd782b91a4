"""The collectives of tensor and sequence parallelism, over a torch.distributed process group.

They are torch's functional collectives (torch.distributed._functional_collectives), so that
torch.compile traces them as ops, and they are asynchronous: each returns at once with a
tensor that waits for the exchange where it is first read (or at wait()), which is what lets a
GEMM run while the next exchange is on the wire. Every one moves whole tensors along their first
dimension (tokens: [tokens, features], or sbhd's sequence), which the parallel modules keep
outermost.
"""
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
# TransformerEngine's import loads torch.distributed.nn (torch's autograd-aware collectives),
# and scripts written against TE call torch.distributed.nn.functional without importing it.
import torch.distributed.nn  # noqa: F401
from torch import Tensor


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def group_size(group: Optional[object] = None) -> int:
    """Ranks in `group` (None: the default group); 1 where torch.distributed is not initialised."""
    return dist.get_world_size(group) if distributed() else 1


def group_rank(group: Optional[object] = None) -> int:
    """This process's rank in `group` (None: the default group); 0 where not initialised."""
    return dist.get_rank(group) if distributed() else 0


def _group(group: Optional[object]):
    return group if group is not None else dist.group.WORLD


def _check_splits(what: str, tensor: Tensor, group: Optional[object]) -> None:
    """ValueError naming the shape unless the first dimension splits evenly over the group."""
    if tensor.shape[0] % group_size(group):
        raise ValueError(f"{what}: the first dimension of a tensor of shape {tuple(tensor.shape)} does not split "
                         f"over {group_size(group)} ranks")


def wait(tensor: Tensor) -> Tensor:
    """The tensor once its exchange has finished (a plain tensor is returned as it is)."""
    return funcol.wait_tensor(tensor) if isinstance(tensor, funcol.AsyncCollectiveTensor) else tensor


def all_gather(tensor: Tensor, group: Optional[object]) -> Tensor:
    """[n, ...] on each rank -> [size * n, ...], the ranks' tensors in rank order."""
    if group_size(group) == 1:
        return tensor
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # moved as their bytes
        return all_gather(tensor.view(torch.uint8), group).view(tensor.dtype)
    return funcol.all_gather_single(tensor.contiguous(), 0, _group(group))


def reduce_scatter(tensor: Tensor, group: Optional[object]) -> Tensor:
    """[size * n, ...] on each rank -> [n, ...]: rank r's share of the ranks' sum."""
    if group_size(group) == 1:
        return tensor
    _check_splits("reduce_scatter", tensor, group)
    return funcol.reduce_scatter_single(tensor.contiguous(), "sum", 0, _group(group))


def all_reduce(tensor: Tensor, group: Optional[object]) -> Tensor:
    """The ranks' sum, on every rank."""
    if group_size(group) == 1:
        return tensor
    return funcol.all_reduce(tensor.contiguous(), "sum", _group(group))


def all_to_all(tensor: Tensor, group: Optional[object]) -> Tensor:
    """[size * n, ...] -> [size * n, ...]: rows [j n, (j + 1) n) go to rank j, and rows
    [i n, (i + 1) n) of the result came from rank i (equal splits)."""
    if group_size(group) == 1:
        return tensor
    _check_splits("all_to_all", tensor, group)
    return funcol.all_to_all_single(tensor.contiguous(), None, None, _group(group))


def ring_shift(tensor: Tensor, group: Optional[object]) -> Tensor:
    """One step round the ring of `group`: `tensor` [n, ...] goes to the next rank (rank + 1 mod
    size) and the previous rank's [n, ...] comes back. An all-to-all in which each rank sends to
    one peer only, so it is asynchronous and traced like the other collectives."""
    size = group_size(group)
    if size == 1:
        return tensor
    rank, rows = group_rank(group), tensor.shape[0]
    send = [rows if peer == (rank + 1) % size else 0 for peer in range(size)]
    receive = [rows if peer == (rank - 1) % size else 0 for peer in range(size)]
    return funcol.all_to_all_single(tensor.contiguous(), receive, send, _group(group))
