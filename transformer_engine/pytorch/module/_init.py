"""TransformerEngine's default weight initialisation, a module-level function (not a lambda)
so that modules holding it as init_method can be pickled whole (torch.save(model))."""
import torch
from torch import Tensor


def default_weight_init(weight: Tensor) -> None:
    """normal(0, 0.023), TE's init_method default."""
    torch.nn.init.normal_(weight, mean=0.0, std=0.023)
