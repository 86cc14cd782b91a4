"""te.Fp8Padding / te.Fp8Unpadding: pad every row block of a grouped input with zero rows up
to a multiple of the FP8 alignment, and take the padding off again.

FP8 GEMM kernels want the token dimension of each group in multiples of 16 (32 for MXFP8's
1x32 blocks), so a mixture-of-experts layer pads each expert's tokens before its
GroupedLinear and unpads after it:

    x, padded_splits = te.Fp8Padding(n)(x, m_splits)
    y = te.Fp8Unpadding(n)(grouped_linear(x, padded_splits), m_splits)

Both are plain differentiable tensor operations (split, pad, concatenate): the gradient of
the padding is the unpadding and the other way round.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..fp8.context import current_context, get_default_recipe
from ..quantization import get_align_size_for_quantization
from ..utils import check_module_input
from .grouped_linear import split_sizes


def _align_size(align_size: Optional[int]) -> int:
    """The given alignment, or the one the recipe in force needs (the default recipe outside
    te.autocast): quantization.get_align_size_for_quantization's."""
    if align_size is not None:
        return align_size
    context = current_context()
    return get_align_size_for_quantization(context.recipe if context is not None else get_default_recipe())


def _padded(sizes: Sequence[int], align: int) -> List[int]:
    return [(m + align - 1) // align * align for m in sizes]


def _check(owner: str, num_gemms: int, align_size: Optional[int]) -> None:
    if num_gemms <= 0:
        raise ValueError(f"{owner}: num_gemms must be positive, got {num_gemms}")
    if align_size is not None and align_size <= 0:
        raise ValueError(f"{owner}: align_size must be positive or None, got {align_size}")


def _rows(owner: str, inp: Tensor) -> Tensor:
    """inp [..., features] as [tokens, features]."""
    check_module_input(owner, "inp", inp)
    return inp if inp.dim() == 2 else inp.reshape(-1, inp.shape[-1])


class Fp8Padding(torch.nn.Module):
    """Pads each row block of a grouped input with zero rows to a multiple of align_size.

    Args: num_gemms (number of row blocks), align_size (None: from the recipe in force at the
    first forward, as TE sets it then: 32 for MXFP8BlockScaling, 128 for NVFP4BlockScaling, a
    CustomRecipe's quantization_alignment, 16 otherwise).
    forward(inp, m_splits) -> (padded_inp, padded_m_splits): inp [sum(m_splits), features]
    (more leading dimensions are flattened into the rows);
    padded_inp [sum(padded_m_splits), features] with block i's rows first, then its zero
    rows; padded_m_splits a list of ints. Already aligned splits return inp as [tokens, features].
    """

    def __init__(self, num_gemms: int, align_size: Optional[int] = None):
        super().__init__()
        _check("Fp8Padding", num_gemms, align_size)
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: Tensor, m_splits: Sequence[int]) -> Tuple[Tensor, List[int]]:
        inp = _rows("Fp8Padding", inp)
        sizes = split_sizes("Fp8Padding", m_splits, self.num_gemms, inp.shape[0])
        self.align_size = _align_size(self.align_size)
        padded = _padded(sizes, self.align_size)
        if list(sizes) == padded:
            return inp, padded
        blocks = torch.split(inp, list(sizes))  # n x [m_i, features]
        # F.pad's last pair pads dim 0: (0 before, p_i - m_i after) rows of zeros
        return torch.cat([torch.nn.functional.pad(block, (0, 0, 0, p - m))
                          for block, m, p in zip(blocks, sizes, padded)]), padded

    def extra_repr(self) -> str:
        return f"num_gemms={self.num_gemms}, align_size={self.align_size}"


class Fp8Unpadding(torch.nn.Module):
    """Removes the zero rows Fp8Padding added.

    Args: num_gemms, align_size (as Fp8Padding's; they must agree).
    forward(inp, m_splits) -> out: inp [sum(padded m_splits), features] (more leading
    dimensions are flattened into the rows); m_splits the
    original, unpadded sizes; out [sum(m_splits), features], the first m_splits[i] rows of
    each padded block. Already aligned splits return inp as [tokens, features].
    """

    def __init__(self, num_gemms: int, align_size: Optional[int] = None):
        super().__init__()
        _check("Fp8Unpadding", num_gemms, align_size)
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: Tensor, m_splits: Sequence[int]) -> Tensor:
        inp = _rows("Fp8Unpadding", inp)
        align = self.align_size = _align_size(self.align_size)
        sizes = split_sizes("Fp8Unpadding", m_splits, self.num_gemms, None)
        padded = _padded(sizes, align)
        if sum(padded) != inp.shape[0]:
            raise ValueError(f"Fp8Unpadding: m_splits {list(sizes)} padded to multiples of {align} are {padded}, "
                             f"{sum(padded)} rows, but the input has {inp.shape[0]} rows")
        if list(sizes) == padded:
            return inp
        blocks = torch.split(inp, padded)  # n x [p_i, features]
        return torch.cat([block[:m] for block, m in zip(blocks, sizes)])

    def extra_repr(self) -> str:
        return f"num_gemms={self.num_gemms}, align_size={self.align_size}"
