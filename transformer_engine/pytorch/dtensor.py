"""DTensor parameters (FSDP2's fully_shard makes every parameter one): the modules and the
optimizers work on each rank's local shard, and wrap what they make from it back into a
DTensor laid out as the parameter was.

torch.distributed.tensor is not imported here: it adds 0.7 s to importing this package, and
a tensor can only be a DTensor once something else (FSDP2, a DeviceMesh user) imported it."""
import sys
from typing import Optional

import torch
from torch import Tensor


def is_dtensor(tensor: object) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local_tensor(tensor: Tensor) -> Tensor:
    """This rank's shard of a DTensor (the tensor FSDP2's hooks and torch's ops see), else the
    tensor itself."""
    return tensor._local_tensor if is_dtensor(tensor) else tensor


def like_dtensor(local: Tensor, template: Tensor) -> Tensor:
    """`local` (this rank's shard, template's local shape) as a DTensor over template's mesh and
    placements, with template's global shape; `local` itself when template is no DTensor."""
    if not is_dtensor(template):
        return local
    if local.shape != template._local_tensor.shape:
        raise ValueError(f"like_dtensor: the local tensor has shape {tuple(local.shape)}, the DTensor's shard "
                         f"{tuple(template._local_tensor.shape)}")
    return type(template).from_local(local, template.device_mesh, template.placements, run_check=False,
                                     shape=template.shape, stride=template.stride())


def shard_group(tensor: Tensor) -> Optional[object]:
    """The process group over which a DTensor's shards are spread: its one mesh dimension with a
    Shard placement (FSDP's; HSDP replicates over the other). None when it is replicated
    everywhere. A tensor sharded over several mesh dimensions is refused: no one mesh
    dimension's group holds all of its shards."""
    from torch.distributed.tensor import Shard
    sharded = [dim for dim, placement in enumerate(tensor.placements) if isinstance(placement, Shard)]
    if len(sharded) > 1:
        raise NotImplementedError(f"a DTensor sharded over {len(sharded)} mesh dimensions (placements "
                                  f"{tensor.placements}) has no single group of shards; FP8 weights need one")
    return tensor.device_mesh.get_group(sharded[0]) if sharded else None


def empty_like_shard(param: Tensor, device: torch.device) -> Tensor:
    """An uninitialised DTensor on `device` with param's layout, dtype and global shape: the
    materialisation of a DTensor parameter made on the "meta" device (FSDP2's deferred
    initialisation), each rank allocating its own shard only."""
    local = torch.empty(param._local_tensor.shape, dtype=param.dtype, device=device)
    return like_dtensor(local, param)
