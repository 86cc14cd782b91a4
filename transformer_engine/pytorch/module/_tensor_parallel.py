"""The tensor-parallel arguments TransformerEngine's modules take, checked and kept the same way
everywhere.

Tensor parallelism is not implemented yet. Callers such as Megatron pass parallel_mode
('column' / 'row'), a tp_group, an RNG tracker and communication-overlap flags even on a
single rank, where they change nothing, so those are accepted (and kept as the attributes TE's
modules have: tp_group, tp_size, parallel_mode); anything that describes more than one rank is
refused.
"""
import contextlib
from typing import Callable, Optional

import torch

PARALLEL_MODES = (None, "column", "row")


def _group_size(tp_group: Optional[object], tp_size: int) -> int:
    """The size of an initialised tp_group (which decides, as in TE), else tp_size."""
    if tp_group is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(tp_group)
    return tp_size


def check_single_rank(module: str, tp_size: int, parallel_mode: Optional[str] = None,
                      tp_group: Optional[object] = None) -> None:
    """ValueError for an unknown parallel_mode; NotImplementedError when the group is not one
    rank."""
    if parallel_mode not in PARALLEL_MODES:
        raise ValueError(f"{module}: parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
    size = _group_size(tp_group, tp_size)
    if size != 1:
        raise NotImplementedError(f"{module}: tensor parallelism (tp_size={size}, parallel_mode={parallel_mode!r}) "
                                  "is not implemented yet")


class TensorParallelAttributes:
    """tp_group / tp_size / parallel_mode as TE's modules carry them, and
    set_tensor_parallel_group(), which Megatron calls once its process groups exist."""

    def _set_tensor_parallel(self, tp_size: int, parallel_mode: Optional[str], tp_group: Optional[object]) -> None:
        check_single_rank(type(self).__name__, tp_size, parallel_mode, tp_group)
        self.tp_group, self.tp_size, self.parallel_mode = tp_group, 1, parallel_mode

    def set_tensor_parallel_group(self, tp_group: Optional[object]) -> None:
        """Sets the tensor-parallel group after construction (one rank only)."""
        check_single_rank(type(self).__name__, 1, self.parallel_mode, tp_group)
        self.tp_group = tp_group


def rng_fork(get_rng_state_tracker: Optional[Callable], rng_tracker_name: Optional[str]):
    """The context weights are initialised in: the tracker's stream `rng_tracker_name` (its
    default stream when None), as Megatron-style trackers expect; no tracker: nothing."""
    if get_rng_state_tracker is None:
        return contextlib.nullcontext()
    tracker = get_rng_state_tracker()
    return tracker.fork(rng_tracker_name) if rng_tracker_name else tracker.fork()
