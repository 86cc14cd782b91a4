"""QuantizedTensor: a parameter stored in FP8 that behaves like a high-precision tensor.

Made by te.quantized_model_init. It holds only the FP8 operand (per-tensor Float8Tensor, or
the row- and column-wise Float8BlockPair of a block recipe) plus the nominal dtype it
reports. te modules under autocast feed the stored FP8 operand straight to their GEMMs;
every other op sees the dequantised values: out-of-place ops return plain tensors, and ops
that write into a QuantizedTensor (an optimizer's add_, copy_ from load_state_dict, ...)
compute in the nominal dtype and re-quantise the result (a fresh scale from its amax), so
the weight never exists in high precision between steps.
"""
from typing import Callable, Hashable, Optional

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from .block_tensor import Float8BlockPair
from .scaling import amax, current_scale
from .tensor import Float8Tensor

aten = torch.ops.aten

# Ops that must keep the FP8 storage rather than dequantise: views of the whole tensor
# that nn.Parameter, autograd and state_dict make.
_ALIASING_OPS = (aten.detach.default, aten.alias.default)


class _Storage:
    """What a QuantizedTensor and all its aliases (detach(), nn.Parameter) share, so that a
    write through any of them is seen by all."""
    __slots__ = ("operand", "quantizer", "layout", "high_precision_init_val")

    def __init__(self, operand, quantizer: Callable[[Tensor], object], layout: Hashable):
        self.operand = operand
        self.quantizer = quantizer
        self.layout = layout  # which recipes' GEMMs can consume the operand as it is
        self.high_precision_init_val: Optional[Tensor] = None


class QuantizedTensor(Tensor):
    """A tensor of nominal dtype `dtype` whose storage is the FP8 operand `operand`;
    `quantizer(x)` re-quantises a high-precision x of the same shape (used on writes);
    `layout` names the operand's FP8 layout (see model_init.fp8_weight_layout)."""

    @staticmethod
    def __new__(cls, operand, dtype: torch.dtype, quantizer: Callable[[Tensor], object], layout: Hashable,
                requires_grad: bool = False):
        return cls._over(_Storage(operand, quantizer, layout), dtype, requires_grad)

    @classmethod
    def _over(cls, storage: _Storage, dtype: torch.dtype, requires_grad: bool = False) -> "QuantizedTensor":
        self = Tensor._make_wrapper_subclass(cls, storage.operand.shape, dtype=dtype, device=storage.operand.device,
                                             requires_grad=requires_grad)
        self._storage = storage
        return self

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"QuantizedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, fp8={self.fp8_dtype})"

    def fp8_operand_for(self, layout: Hashable):
        """The stored FP8 operand (a Float8Tensor or a Float8BlockPair) when a GEMM wanting
        `layout` can consume it as it is, else None."""
        return self._storage.operand if layout == self._storage.layout else None

    @property
    def fp8_dtype(self) -> torch.dtype:
        operand = self._storage.operand
        return (operand.rowwise.data if isinstance(operand, Float8BlockPair) else operand.data).dtype

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        return self._storage.operand.dequantize(dtype or self.dtype)

    def quantize_(self, values: Tensor) -> "QuantizedTensor":
        """Stores `values` (broadcast to this shape), re-quantised."""
        values = values.to(device=self.device, dtype=self.dtype).expand(self.shape).contiguous()
        self._storage.operand = self._storage.quantizer(values)
        return self

    # te.quantized_model_init(preserve_high_precision_init_val=True) keeps the values the
    # parameter was initialised with (on the CPU), e.g. for fp32 master weights.
    def get_high_precision_init_val(self) -> Optional[Tensor]:
        return self._storage.high_precision_init_val

    def clear_high_precision_init_val(self) -> None:
        self._storage.high_precision_init_val = None

    def __reduce_ex__(self, protocol):
        # Pickling (torch.save of the tensor itself) stores the dequantised values: a plain
        # tensor anyone can load, with no code of ours needed.
        return self.dequantize().__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ALIASING_OPS:
            return QuantizedTensor._over(args[0]._storage, args[0].dtype)
        if func is aten._to_copy.default and set(kwargs) <= {"device"} and kwargs.get("device") is not None:
            return _moved(args[0], kwargs["device"])
        written = _written_quantized_args(func, args, kwargs)
        plain = {id(q): q.dequantize() for q in _quantized_leaves((args, kwargs))}

        def unwrap(value):
            return plain[id(value)] if isinstance(value, QuantizedTensor) else value

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        for target in written:
            target.quantize_(plain[id(target)])
        if written and func._schema.returns and func._schema.returns[0].alias_info is not None:
            return args[0]  # an in-place op returns the tensor it wrote
        return out


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


def _moved(source: QuantizedTensor, device) -> QuantizedTensor:
    """The values re-quantised on another device (module.to(device))."""
    storage = source._storage
    return QuantizedTensor(storage.quantizer(source.dequantize().to(device)), source.dtype, storage.quantizer,
                           storage.layout)


def per_tensor_quantizer(fp8_dtype: torch.dtype) -> Callable[[Tensor], Float8Tensor]:
    """x -> Float8Tensor with the current-scaling scale fp8_max / amax(x), its transposed
    codes written in the same pass (the dgrad GEMM of every training step needs them)."""
    def quantize(x: Tensor) -> Float8Tensor:
        scale = current_scale(amax(x).reshape(1), torch.finfo(fp8_dtype).max)
        return Float8Tensor.quantize(x, scale, fp8_dtype, with_transpose=x.dim() == 2)[0]
    return quantize
