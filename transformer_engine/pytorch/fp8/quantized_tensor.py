"""QuantizedTensor: a tensor stored in FP8 that behaves like a high-precision tensor.

Made by the quantizers of transformer_engine.pytorch.tensor (te.quantized_model_init's weights
are such tensors). It holds only the FP8 operand (per-tensor Float8Codes, or the row- and
column-wise Float8BlockPair of a block recipe) plus the nominal dtype it reports. te modules
under autocast feed the stored FP8 operand straight to their GEMMs; views (view / reshape,
split / chunk, slicing) stay quantized and share the storage (fp8/quantized_views.py); every
other op sees the dequantised values: out-of-place ops return plain tensors, and ops that
write into a QuantizedTensor (an optimizer's add_, copy_ from load_state_dict, ...) compute in
the nominal dtype and re-quantise the result (a fresh scale from its amax), so
the weight never exists in high precision between steps.
"""
import dataclasses
from typing import Hashable, Optional

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from .block_tensor import Float8BlockPair
from .codes import Float8Codes
from .operand_copies import copy_into, zeros
from .quantized_views import ViewStorage, quantized_views

aten = torch.ops.aten
_TENSOR_DATA = torch._C.TensorBase.data  # the .data descriptor QuantizedTensor.data overrides

# Ops that must keep the FP8 storage rather than dequantise: views of the whole tensor
# that nn.Parameter, autograd and state_dict make.
_ALIASING_OPS = (aten.detach.default, aten.alias.default)


class _Storage:
    """What a QuantizedTensor and all its aliases (detach(), nn.Parameter) share, so that a
    write through any of them is seen by all. `quantizer` (a tensor.Quantizer) re-quantises
    written values: quantizer.operand_of(x) -> operand; quantizer.layout names which GEMMs
    can consume the operand as it is. `shape` is the nominal shape: block-scaled operands
    hold it flattened to 2-D, [prod(shape[:-1]), shape[-1]]."""
    __slots__ = ("operand", "quantizer", "shape", "high_precision_init_val")

    def __init__(self, operand, quantizer, shape: torch.Size):
        self.operand = operand
        self.quantizer = quantizer
        self.shape = torch.Size(shape)
        self.high_precision_init_val: Optional[Tensor] = None

    def write(self, values: Tensor, noop_flag: Optional[Tensor]) -> None:
        """values (this shape, contiguous) re-quantised into the storage; where the one-element
        noop_flag holds 1 the stored operand stays (chosen on the device: no host sync)."""
        operand = self.quantizer.operand_of(values)
        if noop_flag is not None:
            operand = keep_where(noop_flag.reshape(()) == 1, self.operand, operand)
        self.operand = operand


class QuantizedTensor(Tensor):
    """A tensor of nominal dtype `dtype` stored as an FP8 operand; the base of Float8Tensor,
    Float8BlockwiseQTensor, MXFP8Tensor and NVFP4Tensor (transformer_engine.pytorch.tensor),
    which a quantizer's quantize() makes. QuantizedTensor(shape, dtype) itself, as TE's base
    constructor, is a tensor of that shape holding no data: every op on it raises."""

    _storage: Optional[_Storage] = None
    # TE's get_data_tensors: the attributes holding the row-wise and the column-wise codes.
    _data_tensor_names = ("_rowwise_data", "_columnwise_data")

    def __new__(cls, shape, dtype: torch.dtype, *, requires_grad: bool = False, device=None):
        with torch.inference_mode(False):
            return Tensor._make_wrapper_subclass(cls, torch.Size(shape), dtype=dtype, device=device,
                                                 requires_grad=requires_grad)

    @classmethod
    def _over(cls, storage: _Storage, dtype: torch.dtype, requires_grad: bool = False) -> "QuantizedTensor":
        # A normal tensor even under torch.inference_mode(): autograd sets the version counter
        # of a detach()ed alias of a parameter, which an inference tensor cannot take.
        with torch.inference_mode(False):
            self = Tensor._make_wrapper_subclass(cls, storage.shape, dtype=dtype, device=storage.operand.device,
                                                 requires_grad=requires_grad)
        self._storage = storage
        return self

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __repr__(self, *, tensor_contents=None) -> str:
        if self._storage is None:
            return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}, no data)"
        return f"QuantizedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, fp8={self.fp8_dtype})"

    def get_data_tensors(self, rowwise_data: bool = True, columnwise_data: bool = True):
        """TE's: the row-wise and the column-wise codes as stored (None where not held), both
        as a pair or the one asked for; the same tensor objects on every call and on every
        alias (detach(), nn.Parameter)."""
        rowwise_name, columnwise_name = self._data_tensor_names
        if rowwise_data and columnwise_data:
            return getattr(self, rowwise_name), getattr(self, columnwise_name)
        if rowwise_data:
            return getattr(self, rowwise_name)
        if columnwise_data:
            return getattr(self, columnwise_name)
        raise ValueError(f"{type(self).__name__}.get_data_tensors: rowwise_data and columnwise_data are both False")

    def fp8_operand_for(self, layout: Hashable):
        """The stored FP8 operand (a Float8Codes or a Float8BlockPair) when a GEMM wanting
        `layout` can consume it as it is, else None. (A view of a block-scaled tensor that
        changes its last dimension, such as FSDP2's flat view, keeps its base's 2-D matrix of
        blocks, which is not its own shape's: no GEMM takes it.)"""
        storage = self._storage
        if layout != storage.quantizer.layout:
            return None
        operand = storage.operand
        if not isinstance(operand, Float8Codes) and tuple(operand.shape[-1:]) != tuple(self.shape[-1:]):
            return None  # block-scaled (FP8 blocks, NVFP4) under a view that is not its matrix's
        return operand

    def operand_for_recipe(self, recipe, layout: Hashable, owner: str):
        """fp8_operand_for(layout) under `recipe`, after checking that the recipe's GEMMs take
        this tensor's scheme at all: a weight stored for another kind of recipe (per-tensor,
        Float8BlockScaling, MXFP8) raises RuntimeError, as TE does; the same kind in another
        layout (other block sizes) is cast afresh from the values."""
        if not self._storage.quantizer.serves(recipe):
            raise RuntimeError(f"Recipe mismatch for {owner}: it is stored as {type(self).__name__} "
                               f"({type(self._storage.quantizer).__name__}), which {type(recipe).__name__} cannot "
                               f"use; build the model under quantized_model_init with that recipe, or run it under "
                               f"a recipe of the kind it was stored for")
        return self.fp8_operand_for(layout)

    @property
    def fp8_dtype(self) -> torch.dtype:
        operand = self._storage.operand
        return (operand.stored.data if isinstance(operand, Float8BlockPair) else operand.data).dtype

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        """The values in `dtype` (default: the nominal dtype); differentiable (the gradient
        reaches this tensor unchanged) when this tensor requires grad."""
        if self.requires_grad and torch.is_grad_enabled():
            return _Dequantize.apply(self, dtype or self.dtype)
        return self._values(dtype or self.dtype)

    def _values(self, dtype: torch.dtype) -> Tensor:
        storage = self._storage
        return storage.operand.dequantize(dtype).reshape(storage.shape)

    def quantize_(self, values: Tensor, *, noop_flag: Optional[Tensor] = None) -> "QuantizedTensor":
        """Stores `values` (broadcast to this shape), re-quantised. noop_flag: a one-element
        tensor; where it holds 1 the stored values stay as they are (TE's skip flag, read on
        the device: no host synchronisation)."""
        values = values.to(device=self.device, dtype=self.dtype).expand(self.shape).contiguous()
        self._storage.write(values, noop_flag)
        return self

    @property
    def data(self) -> "QuantizedTensor":
        """An alias without autograd history, quantized as this tensor (torch's .data)."""
        return self.detach()

    @data.setter
    def data(self, values: Tensor) -> None:
        """Assigning .data writes `values` into this tensor, re-quantised (TE's semantics). A
        module's dtype conversion (model.to(torch.bfloat16), .half()) assigns this tensor's
        own values in another dtype: the FP8 storage stays, and the nominal dtype becomes
        theirs. The storage cannot take another shape: refused."""
        if tuple(values.shape) != tuple(self.shape):
            raise ValueError(f"{type(self).__name__}.data: the values assigned must have this tensor's shape "
                             f"{tuple(self.shape)}, got {tuple(values.shape)}")
        if values.dtype != self.dtype:
            _TENSOR_DATA.__set__(self, values)  # torch's own: the reported dtype changes
            return
        with torch.no_grad():
            self.copy_(values)

    # te.quantized_model_init(preserve_high_precision_init_val=True) keeps the values the
    # parameter was initialised with (on the CPU), e.g. for fp32 master weights.
    def get_high_precision_init_val(self) -> Optional[Tensor]:
        return self._storage.high_precision_init_val

    def clear_high_precision_init_val(self) -> None:
        self._storage.high_precision_init_val = None

    @property
    def _high_precision_init_val(self) -> Optional[Tensor]:
        """TE's attribute name for get_high_precision_init_val()."""
        return self._storage.high_precision_init_val

    def _get_quantizer(self):
        """TE's accessor: the quantizer this tensor's values are quantised (and re-quantised
        when written) with."""
        return self._storage.quantizer

    def __reduce_ex__(self, protocol):
        # Pickling (torch.save of the tensor itself) stores the dequantised values: a plain
        # tensor anyone can load, with no code of ours needed.
        return self._values(self.dtype).__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = _quantized_leaves((args, kwargs))
        for quantized in leaves:
            if quantized._storage is None:
                _refuse_without_data(func, quantized)
        if func in _ALIASING_OPS:
            return type(args[0])._over(args[0]._storage, args[0].dtype)
        if func is aten.cat.default:
            kept = _concatenated(*args, **kwargs)
            if kept is not None:
                return kept
        elif isinstance(args[0], QuantizedTensor):  # ops whose result can stay in FP8
            keeps_fp8 = _KEEPS_FP8.get(func)
            kept = keeps_fp8(*args, **kwargs) if keeps_fp8 is not None else quantized_views(func, args, kwargs)
            if kept is not None:
                return kept
        if func is aten._to_copy.default and set(kwargs) <= {"device"} and kwargs.get("device") is not None:
            return _moved(args[0], kwargs["device"])
        written = _written_quantized_args(func, args, kwargs)
        plain = {id(q): q._values(q.dtype) for q in leaves}

        def unwrap(value):
            return plain[id(value)] if isinstance(value, QuantizedTensor) else value

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        for target in written:
            target.quantize_(plain[id(target)])
        if written and func._schema.returns and func._schema.returns[0].alias_info is not None:
            return args[0]  # an in-place op returns the tensor it wrote
        return out


def _refuse_without_data(func, tensor: QuantizedTensor) -> None:
    """An op on a QuantizedTensor built by the base constructor (no codes to read)."""
    name = type(tensor).__name__
    if func in (aten.view.default, aten._unsafe_view.default):
        raise NotImplementedError(f"{name} class does not support tensor views")
    raise NotImplementedError(f"{name} of shape {tuple(tensor.shape)} holds no quantized data: {func} cannot run "
                              f"on it (quantizers make the tensors that hold codes)")


class _Dequantize(torch.autograd.Function):
    """values = dequantize(q): the gradient passes straight through to q, in its nominal dtype."""

    @staticmethod
    def forward(ctx, quantized: QuantizedTensor, dtype: torch.dtype) -> Tensor:
        ctx.nominal_dtype = quantized.dtype
        return quantized._values(dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.to(ctx.nominal_dtype), None


def _quantized_leaves(tree):
    leaves = []
    tree_map(lambda v: leaves.append(v) if isinstance(v, QuantizedTensor) else None, tree)
    return leaves


def _written_quantized_args(func, args, kwargs):
    """The QuantizedTensors the op writes into, per its schema (Tensor(a!) arguments)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        written.extend(_quantized_leaves(value))
    return written


def _with_operand(source: QuantizedTensor, operand, shape) -> QuantizedTensor:
    """A new tensor of source's class, nominal dtype and quantizer holding `operand` (its own
    storage: not an alias of source)."""
    return type(source)._over(_Storage(operand, source._storage.quantizer, shape), source.dtype)


def _cloned(source: QuantizedTensor, memory_format=None) -> QuantizedTensor:
    """A copy that stays quantized (TE's clone): the operand's tensors copied, the same
    quantizer re-quantising later writes."""
    return _with_operand(source, _copied(source._storage.operand), source.shape)


def _copied(operand):
    if isinstance(operand, Tensor):
        return operand.clone()
    if not dataclasses.is_dataclass(operand):
        return operand
    return dataclasses.replace(operand, **{field.name: _copied(getattr(operand, field.name))
                                           for field in dataclasses.fields(operand) if field.init})


def _gathered_rows(source: QuantizedTensor, dim: int, index: Tensor) -> Optional[QuantizedTensor]:
    """index_select of whole rows (dimension 0) kept quantized, as TE's MoE permutation of an
    FP8 tensor: per-tensor codes gathered under the same scale; block-scaled row-wise data
    whose blocks span one row (1 x 32, 1 x 128) gathered with their scales (the column-wise
    copy, whose blocks span rows, is not kept). None where rows cannot be gathered so."""
    operand = source._storage.operand
    if dim not in (0, -source.dim()) or source.dim() < 1:
        return None
    if isinstance(operand, Float8BlockPair):
        rowwise = operand.rowwise
        if source.dim() != 2 or rowwise is None or rowwise.block[0] != 1 or rowwise.transposed:
            return None
        gathered = Float8BlockPair(dataclasses.replace(rowwise, data=rowwise.data.index_select(0, index),
                                                       scale_inv=rowwise.scale_inv.index_select(0, index)), None)
    else:
        gathered = dataclasses.replace(operand, data=operand.data.index_select(0, index), _transpose=None)
    return _with_operand(source, gathered, (index.numel(),) + tuple(source.shape[1:]))


def _concatenated(tensors, dim: int = 0) -> Optional[QuantizedTensor]:
    """cat of per-tensor FP8 tensors cast with one scale (the very same scale_inv tensor, as the
    parts of one cast are: attention's dq, dk, dv meeting in the gradient of the QKV
    projection's output; or equal ones, as split weights cast with their module's one delayed
    scale) kept quantized, their codes concatenated; None (the values) otherwise."""
    first = tensors[0] if tensors else None
    if not isinstance(first, QuantizedTensor) or not isinstance(first._storage.operand, Float8Codes):
        return None
    operands = [t._storage.operand if isinstance(t, QuantizedTensor) else None for t in tensors]
    if any(not isinstance(o, Float8Codes) or o.dtype != operands[0].dtype for o in operands) \
            or any(t.dtype != first.dtype for t in tensors):
        return None
    if any(o.scale_inv is not operands[0].scale_inv and not torch.equal(o.scale_inv, operands[0].scale_inv)
           for o in operands):
        return None
    data = torch.cat([o.data for o in operands], dim)
    return _with_operand(first, Float8Codes(data, operands[0].scale_inv), data.shape)


def _zeros(source: QuantizedTensor, size, dtype=None, layout=None, device=None,
           pin_memory=None) -> Optional[QuantizedTensor]:
    """new_zeros (and new_empty) in source's scheme, quantizer and nominal dtype
    (operand_copies.zeros): how FSDP2 allocates a quantized parameter's shard. None (plain
    zeros) for another dtype or device."""
    if dtype not in (None, source.dtype) or (device is not None and torch.device(device) != source.device):
        return None
    shape = torch.Size(size)
    return _with_operand(source, zeros(source._storage.operand, shape), shape)


def _copied_exactly(dst: QuantizedTensor, src, non_blocking: bool = False) -> Optional[QuantizedTensor]:
    """copy_ between quantized tensors of one layout, the codes and scales copied as they are:
    into a whole tensor, a copy of src's operand replaces dst's; into a view (FSDP2 copies a
    parameter's chunk into a slice of its padded shard), src's codes are written into the
    base's (operand_copies.copy_into) and the base's cached transpose is dropped. None (the
    values are copied and re-quantised) where the codes cannot be copied exactly."""
    storage = dst._storage
    if (not isinstance(src, QuantizedTensor) or dst.shape != src.shape
            or storage.quantizer.layout != src._storage.quantizer.layout):
        return None
    if not isinstance(storage, ViewStorage):
        storage.operand = _copied(src._storage.operand)
        return dst
    if not copy_into(storage.operand, src._storage.operand):
        return None
    while isinstance(storage, ViewStorage):
        storage = storage.base
    if isinstance(storage.operand, Float8Codes):
        storage.operand._transpose = None
    return dst


def _moved(source: QuantizedTensor, device) -> QuantizedTensor:
    """The values re-quantised on another device (module.to(device))."""
    return _with_operand(source, source._storage.quantizer.operand_of(source._values(source.dtype).to(device)),
                         source.shape)


# aten ops (besides the views of fp8/quantized_views.py) whose result stays quantized.
# (new_empty gives zeros: torch.distributed.checkpoint's asynchronous save stages a tensor as
# new_empty of it, then copies its attributes, the storage included, over the result.)
_KEEPS_FP8 = {aten.clone.default: _cloned, aten.index_select.default: _gathered_rows, aten.new_zeros.default: _zeros,
              aten.new_empty.default: _zeros, aten.copy_.default: _copied_exactly}


def keep_where(keep: Tensor, kept, fresh):
    """The operand `kept` where the 0-d bool `keep` is true, else `fresh` (the same type and
    shapes): each of its tensors chosen on the device."""
    if isinstance(kept, Tensor):
        if kept.element_size() == 1:  # FP8 codes and E8M0 scales: chosen as bytes
            return torch.where(keep, kept.view(torch.uint8), fresh.view(torch.uint8)).view(kept.dtype)
        return torch.where(keep, kept, fresh)
    if not dataclasses.is_dataclass(kept):
        return fresh
    chosen = {}
    for field in dataclasses.fields(kept):
        value = getattr(kept, field.name)
        if value is None:  # a cache the kept operand lacks (a transpose): rebuilt on demand
            chosen[field.name] = None
        elif isinstance(value, Tensor) or dataclasses.is_dataclass(value):
            chosen[field.name] = keep_where(keep, value, getattr(fresh, field.name))
    return dataclasses.replace(fresh, **chosen)
