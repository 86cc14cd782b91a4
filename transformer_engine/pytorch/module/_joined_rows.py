"""Split parameters as views of one tensor (TE's layout for parameters_split, the QKV projection's
query / key / value weights): each part is a Parameter over consecutive rows of one joined tensor,
so that a forward reads the joined weight as it lies instead of concatenating the parts (a copy
of the whole weight on every step: on a decoding step, as many bytes again as the GEMM reads).

Where the parts are no longer those views (a parameter replaced, moved by module.to(), sharded
by FSDP2), or are FP8 tensors of their own (module/linear.py's _join_parts), joined() concatenates
them, as before.
"""
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from ..dtensor import is_dtensor
from ..fp8.quantized_tensor import QuantizedTensor


def views_of(joined: Tensor, parts: Sequence[torch.nn.Parameter]) -> List[torch.nn.Parameter]:
    """Parameters over consecutive rows of `joined`, one per part, with each part's row count,
    requires_grad and attributes (tensor-parallel marks and the like)."""
    views, start = [], 0
    for part in parts:
        rows = part.shape[0]
        view = torch.nn.Parameter(joined[start:start + rows], requires_grad=part.requires_grad)
        view.__dict__.update(part.__dict__)
        views.append(view)
        start += rows
    return views


def joinable(parts: Sequence[Tensor]) -> bool:
    """Whether parts can be re-made as views of one tensor: plain tensors of one dtype and
    device, not sharded (DTensor) nor quantized, with rows of one width."""
    first = parts[0]
    return (len(parts) > 1 and not any(is_dtensor(p) or isinstance(p, QuantizedTensor) for p in parts)
            and all(p.dim() >= 1 and p.shape[1:] == first.shape[1:] and p.dtype == first.dtype
                    and p.device == first.device for p in parts))


def _still_views(joined: Tensor, parts: Sequence[Tensor]) -> bool:
    """Whether parts are still the consecutive row views of `joined` that views_of made."""
    if sum(p.shape[0] for p in parts) != joined.shape[0]:
        return False
    row_bytes = joined.stride(0) * joined.element_size()
    start = 0
    for part in parts:
        if type(part) not in (Tensor, torch.nn.Parameter) or part.data_ptr() != joined.data_ptr() + start * row_bytes \
                or part.stride() != joined.stride():
            return False
        start += part.shape[0]
    return True


class _JoinedViews(torch.autograd.Function):
    """The joined tensor of its parts' views, with no copy; the gradient split back to the parts."""

    @staticmethod
    def forward(ctx, joined: Tensor, *parts: Tensor) -> Tensor:
        ctx.rows = [part.shape[0] for part in parts]
        return joined.detach()  # an alias of the joined storage

    @staticmethod
    def backward(ctx, grad: Tensor):
        return (None, *grad.split(ctx.rows))


def joined(parts: Sequence[Tensor], joined_tensor: Optional[Tensor]) -> Tensor:
    """The parts' rows joined: joined_tensor itself while the parts are its views (gradients
    reach the parts), else torch.cat of the parts (also while torch.compile traces: the views
    are checked by their data pointers, which it cannot trace, and its graph fuses the copy)."""
    if joined_tensor is not None and not torch.compiler.is_compiling() and _still_views(joined_tensor, parts):
        return _JoinedViews.apply(joined_tensor, *parts)
    return torch.cat(list(parts))
