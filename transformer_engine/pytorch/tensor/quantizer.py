"""Quantizer: TransformerEngine 2.x's builder of quantized tensors, the base of
Float8Quantizer, Float8CurrentScalingQuantizer, Float8BlockQuantizer and MXFP8Quantizer.

    q = Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device="cuda")
    x8 = q(x)                        # a Float8Tensor: x's FP8 codes and their scale
    q.update_quantized(y, x8)        # y's codes into x8

A quantizer names a scaling scheme; its `operand_of(x)` casts x to the internal FP8 operand
(fp8/codes.py, fp8/block_tensor.py) and `tensor_class` wraps that operand as the matching
QuantizedTensor. `layout` names the operand's layout: a te module feeds a stored FP8 weight to
its GEMMs as it is only when the recipe in force wants the same layout.
"""
from typing import Dict, Hashable, Optional, Union

import torch
from torch import Tensor

from ..constants import DType
from ..fp8.block_tensor import Float8BlockPair
from ..fp8.codes import Float8Codes
from ..fp8.quantized_tensor import QuantizedTensor, _Storage

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_torch_dtype(fp8_dtype: Union[DType, torch.dtype], owner: str) -> torch.dtype:
    """The torch dtype of an FP8 format given as te.DType or torch dtype; anything else is refused."""
    dtype = fp8_dtype.to_torch() if isinstance(fp8_dtype, DType) else fp8_dtype
    if dtype not in FP8_DTYPES:
        raise ValueError(f"{owner}: fp8_dtype must be te.DType.kFloat8E4M3 or kFloat8E5M2 (or the torch "
                         f"float8_e4m3fn / float8_e5m2), got {fp8_dtype!r}")
    return dtype


class Quantizer:
    """rowwise / columnwise: which usages the quantized tensor keeps (TE's set_usage); a GEMM
    contracting the tensor's last dimension reads the row-wise data, one contracting its
    first dimension the column-wise data."""
    tensor_class = QuantizedTensor

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True) -> None:
        self.rowwise_usage = rowwise
        self.columnwise_usage = columnwise
        self.internal = False

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(fp8_dtype={self.fp8_dtype}, rowwise={self.rowwise_usage}, "
                f"columnwise={self.columnwise_usage})")

    # What each scheme defines.
    fp8_dtype: torch.dtype

    @property
    def layout(self) -> Hashable:
        raise NotImplementedError

    def operand_of(self, x: Tensor):
        raise NotImplementedError

    def serves(self, recipe) -> bool:
        """Whether `recipe`'s GEMMs can take tensors of this scheme (TE's compatible recipe)."""
        raise NotImplementedError

    # TE's interface over them.
    @property
    def dtype(self) -> DType:
        """The FP8 format as te.DType (TE's quantizer.dtype)."""
        return DType.of_torch(self.fp8_dtype)

    def set_usage(self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None) -> None:
        if rowwise is not None:
            self.rowwise_usage = rowwise
        if columnwise is not None:
            self.columnwise_usage = columnwise

    def get_usages(self) -> Dict[str, bool]:
        return {"rowwise": self.rowwise_usage, "columnwise": self.columnwise_usage}

    def quantize(self, tensor: Tensor, *, out: Optional[QuantizedTensor] = None,
                 dtype: Optional[torch.dtype] = None) -> QuantizedTensor:
        """tensor cast to FP8, as a QuantizedTensor of nominal dtype `dtype` (default
        tensor's); into `out` when given."""
        if out is not None:
            return self.update_quantized(tensor, out)
        self._check_input(tensor)
        if isinstance(tensor, QuantizedTensor):  # another scheme's (or this one's) tensor: cast its values
            tensor = tensor.dequantize()
        if tensor.requires_grad and torch.is_grad_enabled():
            return _Quantize.apply(tensor, self, dtype or tensor.dtype)
        return self._quantized(tensor, dtype or tensor.dtype)

    def _quantized(self, tensor: Tensor, dtype: torch.dtype) -> QuantizedTensor:
        return self.tensor_of(self.operand_of(tensor.detach()), tensor.shape, dtype)

    def tensor_of(self, operand, shape, dtype: torch.dtype) -> QuantizedTensor:
        """The QuantizedTensor of nominal `shape` and `dtype` holding `operand`, cast by this
        quantizer (which re-quantises what is written into it)."""
        return self.tensor_class._over(_Storage(operand, self, shape), dtype)

    def __call__(self, tensor: Tensor) -> QuantizedTensor:
        return self.quantize(tensor)

    def update_quantized(self, src: Tensor, dst: QuantizedTensor, *,
                         noop_flag: Optional[Tensor] = None) -> QuantizedTensor:
        """src's values cast into dst (same shape), which from then on re-quantises with this
        quantizer; where noop_flag holds 1, dst is left as it was."""
        if not isinstance(dst, self.tensor_class):
            raise ValueError(f"{type(self).__name__}.update_quantized: dst must be a {self.tensor_class.__name__}, "
                             f"got {type(dst).__name__}")
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(f"{type(self).__name__}.update_quantized: src has shape {tuple(src.shape)}, "
                             f"dst {tuple(dst.shape)}")
        dst._storage.quantizer = self
        return dst.quantize_(src, noop_flag=noop_flag)

    def make_empty(self, shape, *, dtype: torch.dtype = torch.float32, device=None,
                   requires_grad: bool = False) -> QuantizedTensor:
        """A quantized tensor of `shape` (zeros), nominal dtype `dtype`."""
        zeros = torch.zeros(shape, dtype=dtype, device=device)
        return self.quantize(zeros).requires_grad_(requires_grad)

    def calibrate(self, tensor: Tensor) -> None:
        """Observes tensor without casting it (only delayed scaling keeps what it sees)."""

    def share_scale_over(self, group) -> None:
        """Makes this quantizer's casts agree over `group`, whose ranks each hold a shard of one
        tensor (FSDP2's), so that the shards' codes together are the whole tensor's cast.
        Nothing to do here: block scales belong to their blocks, and delayed scaling's scale is
        the module's, which the recipe's update keeps equal over the ranks."""

    def copy(self) -> "Quantizer":
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def is_quantizable(self, tensor: Tensor) -> bool:
        return True

    def _check_input(self, tensor: Tensor) -> None:
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            raise TypeError(f"{type(self).__name__}: the tensor to quantize must be a floating-point torch.Tensor, "
                            f"got {getattr(tensor, 'dtype', type(tensor).__name__)}")


class _Quantize(torch.autograd.Function):
    """q = quantize(x): the gradient passes straight through to x (TE's quantize is the
    identity for autograd)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, quantizer: Quantizer, dtype: torch.dtype) -> QuantizedTensor:
        ctx.input_dtype = tensor.dtype
        return quantizer._quantized(tensor, dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if isinstance(grad, QuantizedTensor):
            grad = grad.dequantize()
        return grad.to(ctx.input_dtype), None, None


def operand_for(quantizer: Quantizer, tensor: Tensor):
    """The FP8 operand of `tensor` where `quantizer` would cast it: a QuantizedTensor's own
    operand, as it is, when its layout is the quantizer's and it holds the usages the quantizer
    makes (TE does not cast an FP8 tensor handed to a GEMM again: the quantizer's slot records
    no amax), per-tensor codes made contiguous; else tensor cast by the quantizer."""
    if isinstance(tensor, QuantizedTensor):
        operand = tensor.fp8_operand_for(quantizer.layout)
        if isinstance(operand, Float8Codes):  # a view's codes (a split, a permute) as one block
            return operand if operand.data.is_contiguous() else Float8Codes(operand.data.contiguous(),
                                                                            operand.scale_inv)
        if isinstance(operand, Float8BlockPair) and _holds_usages(operand, quantizer):
            return operand
    return quantizer.operand_of(tensor)


def _holds_usages(operand: Float8BlockPair, quantizer: Quantizer) -> bool:
    """Whether block-scaled data has each layout the quantizer would make (the column-wise one
    for the backward GEMMs: per-tensor codes transpose on demand, blocks cannot)."""
    return ((operand.rowwise is not None or not quantizer.rowwise_usage)
            and (operand.columnwise is not None or not quantizer.columnwise_usage))
