"""The tensor-parallel arguments TransformerEngine's modules take, checked the same way everywhere.

Tensor parallelism is not implemented yet. Callers such as Megatron pass parallel_mode
('column' / 'row') and a tp_group even on a single rank, where they change nothing, so those
are accepted; anything that describes more than one rank is refused.
"""
from typing import Optional

import torch

PARALLEL_MODES = (None, "column", "row")


def check_single_rank(module: str, tp_size: int, parallel_mode: Optional[str] = None,
                      tp_group: Optional[object] = None) -> None:
    """ValueError for an unknown parallel_mode; NotImplementedError when tp_size, or the size
    of an initialised tp_group (which decides, as in TE), is not 1."""
    if parallel_mode not in PARALLEL_MODES:
        raise ValueError(f"{module}: parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
    if tp_group is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        tp_size = torch.distributed.get_world_size(tp_group)
    if tp_size != 1:
        raise NotImplementedError(f"{module}: tensor parallelism (tp_size={tp_size}, parallel_mode={parallel_mode!r}) "
                                  "is not implemented yet")
