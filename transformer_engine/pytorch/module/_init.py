"""TransformerEngine's default weight initialisation, a module-level function (not a lambda)
so that modules holding it as init_method can be pickled whole (torch.save(model)), and the
materialisation of deferred ("meta") parameters that reset_parameters() starts with."""
import torch
from torch import Tensor

from ..dtensor import empty_like_shard, is_dtensor
from ..utils import default_device


def default_weight_init(weight: Tensor) -> None:
    """normal(0, 0.023), TE's init_method default."""
    torch.nn.init.normal_(weight, mean=0.0, std=0.023)


def materialize_parameters(module: torch.nn.Module) -> None:
    """Puts the module's own parameters that live on the "meta" device (deferred initialisation,
    as FSDP builds models) onto the current device (the accelerator, else the CPU), uninitialised
    and keeping their dtype, requires_grad and attributes: reset_parameters() then initialises
    them, as TE's modules do. A DTensor parameter (fully_shard applied to a module built on
    "meta") becomes a DTensor of the same layout, each rank allocating its shard only."""
    for name, param in list(module.named_parameters(recurse=False)):
        if param.device.type != "meta":
            continue
        values = (empty_like_shard(param, default_device()) if is_dtensor(param)
                  else torch.empty(param.shape, dtype=param.dtype, device=default_device()))
        real = torch.nn.Parameter(values, requires_grad=param.requires_grad)
        real.__dict__.update(param.__dict__)  # e.g. sequence_parallel, tensor-parallel attributes
        setattr(module, name, real)
