"""The tensor-parallel arguments TransformerEngine's modules take, checked and kept the same way
everywhere: tp_group / tp_size / parallel_mode / sequence_parallel as TE's modules carry them,
the GemmSplit each GEMM runs with (parallel/gemm_split.py), and the partition attributes of
the parameters.

The group decides the size when it is an initialised process group of more than one rank (as
in TE); tp_size is taken otherwise (Megatron passes both before its groups exist, then calls
set_tensor_parallel_group). tp_group=None with tp_size > 1 means the default group.
"""
import contextlib
from typing import Callable, Optional

import torch

from ..parallel.collectives import distributed, group_size
from ..parallel.gemm_split import GemmSplit

PARALLEL_MODES = (None, "column", "row")


def resolved_size(tp_group: Optional[object], tp_size: int) -> int:
    """The size of an initialised tp_group (which decides, as in TE), else tp_size."""
    if tp_group is not None and distributed():
        return group_size(tp_group)
    return tp_size


def divide(owner: str, what: str, size: int, ranks: int) -> int:
    """size / ranks, refused with the module's name when it does not divide."""
    if size % ranks:
        raise ValueError(f"{owner}: {what}={size} does not split over {ranks} tensor-parallel ranks")
    return size // ranks


class TensorParallelAttributes:
    """tp_group, tp_size, parallel_mode and sequence_parallel as TE's modules carry them;
    set_tensor_parallel_group(), which Megatron calls once its process groups exist; the
    GemmSplit of a GEMM."""

    def _set_tensor_parallel(self, tp_size: int, parallel_mode: Optional[str], tp_group: Optional[object],
                             sequence_parallel: bool = False) -> None:
        owner = type(self).__name__
        if parallel_mode not in PARALLEL_MODES:
            raise ValueError(f"{owner}: parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
        size = resolved_size(tp_group, tp_size)
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{owner}: tp_size must be a positive int, got {tp_size!r}")
        self.tp_group, self.tp_size, self.parallel_mode = tp_group, size, parallel_mode
        self.sequence_parallel = size > 1 and bool(sequence_parallel)  # as TE: meaningless on one rank

    def set_tensor_parallel_group(self, tp_group: Optional[object]) -> None:
        """Sets the tensor-parallel group after construction; its size must be the tp_size the
        parameters were split for."""
        size = resolved_size(tp_group, self.tp_size)
        if size != self.tp_size:
            raise ValueError(f"{type(self).__name__}: set_tensor_parallel_group: the group has {size} ranks, the "
                             f"module was built for tp_size={self.tp_size}")
        self.tp_group = tp_group

    def _gemm_split(self, mode: Optional[str]) -> Optional[GemmSplit]:
        """The split of a GEMM in `mode` ('column' / 'row'; None: not split) over the module's
        group, or None on one rank."""
        if mode is None or self.tp_size == 1:
            return None
        if not distributed():
            raise RuntimeError(f"{type(self).__name__}: tp_size={self.tp_size} needs torch.distributed to be "
                               "initialised (torch.distributed.init_process_group) before the forward")
        split = GemmSplit(self.tp_group, mode, self.sequence_parallel)
        if split.size != self.tp_size:
            raise RuntimeError(f"{type(self).__name__}: tp_group has {split.size} ranks, the module was built for "
                               f"tp_size={self.tp_size}")
        return split


def sharded_tokens(owner: str, inp: torch.Tensor, split: Optional[GemmSplit]) -> tuple:
    """The leading shape of a GEMM module's output for `inp` [..., features] under `split`:
    the first dimension (the sequence of sbhd, or the tokens) times the group size where the
    GEMM gathers the token shards, divided by it where the output is reduce-scattered."""
    lead = tuple(inp.shape[:-1])
    if split is None or not lead or not (split.gathers_input or split.gathers_grad_output):
        return lead
    if split.gathers_grad_output and lead[0] % split.size:
        raise ValueError(f"{owner}: sequence parallelism splits the first dimension of the output, "
                         f"{lead[0]} (input of shape {tuple(inp.shape)}), over {split.size} ranks: it does not divide")
    return (split.tokens_out(lead[0]),) + lead[1:]


def rng_fork(get_rng_state_tracker: Optional[Callable], rng_tracker_name: Optional[str]):
    """The context weights are initialised in: the tracker's stream `rng_tracker_name` (its
    default stream when None), as Megatron-style trackers expect; no tracker: nothing."""
    if get_rng_state_tracker is None:
        return contextlib.nullcontext()
    tracker = get_rng_state_tracker()
    return tracker.fork(rng_tracker_name) if rng_tracker_name else tracker.fork()
