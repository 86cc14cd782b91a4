"""Views of a QuantizedTensor that stay quantized, as TransformerEngine's are: view / reshape,
(un)squeeze, split / chunk, basic slicing along one dimension, and permutes of per-tensor codes.

A view does not copy the FP8 data: its operand is cut from its base's on every read (so a write
into the base shows in the view), and a write into the view writes its values into the base's
and re-quantises the base (so the view's part of the base changes, and the base's scale, when
it has one, stays one scale for all of it). Cuts the FP8 layout cannot express return None and
the caller computes on the dequantised values instead, as for any other op:
  - per-tensor codes: every view, split, slice, permute and transpose (the codes are viewed,
    narrowed or permuted, the one scale_inv shared; a view of codes that a permute or a narrow
    left non-contiguous reads them through reshape, a copy of the codes where no view exists);
  - block-scaled operands (FP8 and NVFP4), held as the 2-D matrix [prod(shape[:-1]), shape[-1]]:
    views that keep the last dimension (the matrix is the same) and flat views (1-D, over the
    same matrix, which no GEMM takes: QuantizedTensor.fp8_operand_for), and splits / slices of
    the first dimension that start and end on block boundaries of every usage held (NVFP4's
    column-wise usage: its columns, the transpose's);
  - as_strided onto the tensor's own size and contiguous strides (an alias).
"""
import dataclasses
import math
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .block_tensor import Float8BlockPair, Float8BlockTensor
from .codes import Float8Codes
from .nvfp4_operand import Nvfp4Pair

aten = torch.ops.aten


class ViewStorage:
    """The storage of a view: its base's storage (a quantized tensor's, or another view's),
    the view's shape, and how to cut the view from the base's operand and from its values."""
    __slots__ = ("base", "shape", "cut_operand", "cut_values")

    def __init__(self, base, shape: torch.Size, cut_operand: Callable, cut_values: Callable[[Tensor], Tensor]):
        self.base, self.shape = base, torch.Size(shape)
        self.cut_operand, self.cut_values = cut_operand, cut_values

    @property
    def operand(self):
        return self.cut_operand(self.base.operand)

    @property
    def quantizer(self):
        return self.base.quantizer

    @quantizer.setter
    def quantizer(self, quantizer) -> None:
        self.base.quantizer = quantizer  # the view is re-quantised as part of its base

    @property
    def high_precision_init_val(self) -> Optional[Tensor]:
        """The base's, for a view of all of it in its shape (view_as, as DTensor.from_local
        wraps a shard); no other view keeps any."""
        return self.base.high_precision_init_val if self.shape == self.base.shape else None

    @high_precision_init_val.setter
    def high_precision_init_val(self, value: Optional[Tensor]) -> None:
        if self.shape == self.base.shape:
            self.base.high_precision_init_val = value
        elif value is not None:
            raise RuntimeError("a view of part of a quantized tensor keeps no high-precision initial values")

    def write(self, values: Tensor, noop_flag: Optional[Tensor]) -> None:
        """values (the view's shape, its dtype) written into the base's values, and the base
        re-quantised."""
        full = self.base.operand.dequantize(values.dtype).reshape(self.base.shape)
        self.cut_values(full).copy_(values)
        self.base.write(full, noop_flag)


def quantized_views(func, args, kwargs) -> Optional[object]:
    """The result of view op `func` on a QuantizedTensor args[0] as quantized views (one, or a
    list for split), or None when the op is not a view op handled here or its cut cannot be
    expressed in the FP8 layout."""
    handler = _HANDLERS.get(func)
    return None if handler is None else handler(*args, **kwargs)


def _view(source, size: Sequence[int]):
    shape = torch.empty(source.shape, device="meta").view(size).shape
    operand = source._storage.operand
    if isinstance(operand, Float8Codes):
        def cut(base: Float8Codes) -> Float8Codes:
            return Float8Codes(base.data.reshape(shape), base.scale_inv)
    elif shape[-1:] == operand.shape[-1:] or len(shape) == 1:
        # The same 2-D matrix of blocks, or a flat view of it (FSDP2 keeps one of each shard),
        # which no GEMM takes (QuantizedTensor.fp8_operand_for) and no row cut applies to.
        def cut(base: Float8BlockPair) -> Float8BlockPair:
            return base
    else:
        return None
    return _make(source, shape, cut, lambda values: values.view(shape))


def _squeeze(source, dim: int):
    dim = _dim(source, dim)
    return _view(source, source.shape if source.shape[dim] != 1 else source.shape[:dim] + source.shape[dim + 1:])


def _unsqueeze(source, dim: int):
    dim = dim + source.dim() + 1 if dim < 0 else dim
    return _view(source, source.shape[:dim] + (1,) + source.shape[dim:])


def _as_strided(source, size: Sequence[int], stride: Sequence[int], storage_offset: Optional[int] = None):
    """The one as_strided that is a view of the whole tensor as it is (FSDP2 applies it to a
    gathered parameter): an alias; any other is computed on the values."""
    if tuple(size) != tuple(source.shape) or (storage_offset or 0) != 0:
        return None
    contiguous = [1] * len(size)
    for dim in range(len(size) - 2, -1, -1):
        contiguous[dim] = contiguous[dim + 1] * max(size[dim + 1], 1)
    if any(s != c for s, c, n in zip(stride, contiguous, size) if n > 1):
        return None
    return type(source)._over(source._storage, source.dtype)


def _permute(source, dims: Sequence[int]):
    """Per-tensor codes permuted as the values are (attention's [s, b, h, d] <-> [b, h, s, d]
    views of an FP8 q, k, v or output); block-scaled operands, whose blocks follow the last
    dimension, are computed on their values."""
    if not isinstance(source._storage.operand, Float8Codes):
        return None
    dims = [_dim(source, d) for d in dims]
    shape = torch.Size(source.shape[d] for d in dims)

    def cut(base: Float8Codes) -> Float8Codes:
        return Float8Codes(base.data.permute(dims), base.scale_inv)
    return _make(source, shape, cut, lambda values: values.permute(dims))


def _transpose(source, dim0: int, dim1: int):
    dims = list(range(source.dim()))
    dim0, dim1 = _dim(source, dim0), _dim(source, dim1)
    dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return _permute(source, dims)


def _split(source, split_size, dim: int = 0):
    dim = _dim(source, dim)
    if isinstance(split_size, int):
        if split_size <= 0:
            return None  # torch's own error, from the values
        length = source.shape[dim]
        sizes = [min(split_size, length - start) for start in range(0, length, split_size)] or [0]
    else:
        sizes = list(split_size)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    pieces = [_narrow(source, dim, start, size) for start, size in zip(starts, sizes)]
    return None if any(piece is None for piece in pieces) else pieces


def _slice(source, dim: int = 0, start: Optional[int] = None, end: Optional[int] = None, step: int = 1):
    if step != 1:
        return None
    dim = _dim(source, dim)
    start, end, _ = slice(start, end).indices(source.shape[dim])
    return _narrow(source, dim, start, max(end - start, 0))


def _narrow(source, dim: int, start: int, length: int):
    shape = list(source.shape)
    shape[dim] = length
    operand = source._storage.operand
    if isinstance(operand, Float8Codes):
        def cut(base: Float8Codes) -> Float8Codes:
            return Float8Codes(base.data.narrow(dim, start, length), base.scale_inv)
    elif isinstance(operand, Nvfp4Pair):
        rows = _matrix_rows(source.shape, dim, start, length)
        if rows is None or not operand.cuts_at_blocks(*rows):
            return None

        def cut(base: Nvfp4Pair) -> Nvfp4Pair:
            return base.rows(*rows)
    else:
        rows = _matrix_rows(source.shape, dim, start, length)
        if rows is None or not _on_block_rows(operand, *rows):
            return None

        def cut(base: Float8BlockPair) -> Float8BlockPair:
            rowwise = _block_rows(base.rowwise, *rows)
            if base.columnwise is base.rowwise:  # square blocks: one tensor serves both usages, and still does
                return Float8BlockPair(rowwise, rowwise)
            return Float8BlockPair(rowwise, _block_rows(base.columnwise, *rows))
    return _make(source, torch.Size(shape), cut, lambda values: values.narrow(dim, start, length))


def _matrix_rows(shape: torch.Size, dim: int, start: int, length: int) -> Optional[Tuple[int, int]]:
    """The rows [first, stop) of the 2-D matrix [prod(shape[:-1]), shape[-1]] that a narrow of
    dimension 0 covers; None for any other dimension (not a row range)."""
    if dim != 0 or len(shape) < 2:
        return None
    per_index = math.prod(shape[1:-1])  # rows of the matrix per index of dimension 0
    return start * per_index, (start + length) * per_index


def _on_block_rows(operand: Float8BlockPair, first: int, stop: int) -> bool:
    total = operand.stored.data.shape[0]
    return all(first % usage.block[0] == 0 and (stop % usage.block[0] == 0 or stop == total)
               for usage in (operand.rowwise, operand.columnwise) if usage is not None)


def _block_rows(usage: Optional[Float8BlockTensor], first: int, stop: int) -> Optional[Float8BlockTensor]:
    if usage is None:
        return None
    rows_per_scale = usage.block[0]
    return dataclasses.replace(usage, data=usage.data[first:stop],
                               scale_inv=usage.scale_inv[first // rows_per_scale:-(-stop // rows_per_scale)])


def _dim(source, dim: int) -> int:
    return dim + source.dim() if dim < 0 else dim


def _make(source, shape: torch.Size, cut_operand: Callable, cut_values: Callable):
    return type(source)._over(ViewStorage(source._storage, shape, cut_operand, cut_values), source.dtype)


_HANDLERS = {aten.view.default: _view, aten._unsafe_view.default: _view, aten.split.Tensor: _split,
             aten.split_with_sizes.default: _split, aten.slice.Tensor: _slice, aten.as_strided.default: _as_strided,
             aten.permute.default: _permute, aten.transpose.int: _transpose, aten.squeeze.dim: _squeeze,
             aten.unsqueeze.default: _unsqueeze}
