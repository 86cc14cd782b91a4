"""Per-tensor FP8: Float8Quantizer (delayed scaling: a given scale, amax recorded),
Float8CurrentScalingQuantizer (the scale from the tensor's own amax) and Float8Tensor.

Both cast as TE does: codes = saturate(x * scale) rounded to nearest even, scale_inv =
1 / scale in fp32, value = code * scale_inv.
"""
import copy
from typing import Hashable, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ..constants import DType
from ..custom_ops.fp8_cast import fp8_quantize_current
from ..fp8.codes import Float8Codes
from ..fp8.quantized_tensor import QuantizedTensor, _Storage
from ..scaling import amax as tensor_amax, current_scale
from .fsdp2 import Fsdp2AllGather
from .quantizer import Quantizer, fp8_torch_dtype


class Float8Tensor(Fsdp2AllGather, QuantizedTensor):
    """FP8 codes with one fp32 scale_inv. TE's attributes: _data (the codes as uint8, sharing
    memory), _scale_inv ([1] fp32), _fp8_dtype (te.DType), _transpose (the [n, m] codes of a
    2-D tensor, when made), _quantizer. Under FSDP2 its codes are what the shards gather
    (tensor/fsdp2.py).

    Float8Tensor(shape=, dtype=, data=uint8 codes, fp8_scale_inv=, fp8_dtype=, quantizer=None)
    wraps existing codes; writes into it re-quantise with `quantizer` (default: delayed
    scaling at 1 / fp8_scale_inv)."""

    def __new__(cls, *, shape, dtype: torch.dtype, data: Tensor, fp8_scale_inv: Tensor,
                fp8_dtype: Union[DType, torch.dtype], data_transpose: Optional[Tensor] = None,
                quantizer: Optional[Quantizer] = None, requires_grad: bool = False, device=None, **unused):
        torch_dtype = fp8_torch_dtype(fp8_dtype, "Float8Tensor")
        if tuple(data.shape) != tuple(shape):
            raise ValueError(f"Float8Tensor: data has shape {tuple(data.shape)}, shape is {tuple(shape)}")
        scale_inv = fp8_scale_inv.reshape(1).to(device=data.device, dtype=torch.float32)
        transpose = None if data_transpose is None else Float8Codes(data_transpose.view(torch_dtype), scale_inv)
        codes = Float8Codes(data.view(torch_dtype), scale_inv, transpose)
        if quantizer is None:
            quantizer = Float8Quantizer(torch.reciprocal(scale_inv), torch.zeros(1, device=data.device), torch_dtype)
        return cls._over(_Storage(codes, quantizer, shape), dtype, requires_grad)

    def __repr__(self, *, tensor_contents=None) -> str:
        return (f"Float8Tensor(fp8_dtype={self._fp8_dtype.name}, scale_inv={self._scale_inv.item():g}, "
                f"data={self.dequantize()})")

    _data_tensor_names = ("_data", "_transpose")

    @property
    def _data(self) -> Optional[Tensor]:
        """The codes as uint8: one view object while they are the same codes (as _transpose)."""
        operand = self._storage.operand
        return None if operand.data is None else operand.as_uint8()

    @_data.setter
    def _data(self, codes: Optional[Tensor]) -> None:
        """Replaces the stored codes (uint8 or FP8), or drops them (None: e.g. offloaded)."""
        operand = self._storage.operand
        operand.data = None if codes is None else codes.view(operand.dtype if operand.data is None else
                                                                operand.data.dtype)

    @property
    def _scale_inv(self) -> Tensor:
        return self._storage.operand.scale_inv

    @property
    def _fp8_dtype(self) -> DType:
        return DType.of_torch(self._storage.operand.data.dtype)

    @property
    def _transpose(self) -> Optional[Tensor]:
        """The transposed codes as uint8: the same tensor object on every read while they are
        the same codes (TE's attribute is stored; code compares it by identity)."""
        cached = self._storage.operand._transpose
        return None if cached is None else cached.as_uint8()

    @property
    def _transpose_invalid(self) -> bool:
        """No transposed codes are held (TE's flag; made on demand when a GEMM needs them)."""
        return self._storage.operand._transpose is None

    @_transpose.setter
    def _transpose(self, codes: Optional[Tensor]) -> None:
        operand = self._storage.operand
        operand._transpose = None if codes is None else Float8Codes(codes.view(operand.data.dtype), operand.scale_inv)

    @property
    def _quantizer(self) -> Quantizer:
        return self._storage.quantizer

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None) -> None:
        """Per-tensor codes serve both usages: the column-wise one is their transpose, made
        here when asked for (2-D) and dropped with columnwise_usage=False."""
        operand = self._storage.operand
        if columnwise_usage is False:
            operand._transpose = None
        elif columnwise_usage and operand.data is not None and operand.data.dim() == 2:
            operand.t()

    def get_usages(self) -> dict:
        return {"rowwise": self._storage.operand.data is not None,
                "columnwise": self._storage.operand._transpose is not None}


def per_tensor_layout(fp8_dtype: torch.dtype) -> Hashable:
    """The layout key of per-tensor FP8 codes (every per-tensor quantizer's)."""
    return ("per-tensor", fp8_dtype)


class _PerTensorQuantizer(Quantizer):
    tensor_class = Float8Tensor

    @property
    def layout(self) -> Hashable:
        return per_tensor_layout(self.fp8_dtype)

    def serves(self, recipe) -> bool:
        return recipe.float8_per_tensor_scaling()

    def _cast(self, x: Tensor, scale: Tensor) -> "tuple[Float8Codes, Tensor]":
        """(codes of x at `scale`, with the transposed codes when the column-wise usage of a
        2-D x is wanted; amax of x)."""
        return Float8Codes.quantize(x, scale.reshape(1).float(), self.fp8_dtype,
                                    with_transpose=self.columnwise_usage and x.dim() == 2)


class Float8Quantizer(_PerTensorQuantizer):
    """Delayed scaling: casts with `scale` ([1] fp32, set by the recipe's update) and keeps
    the running maximum of what it casts in `amax` ([1] fp32), which the recipe consumes."""

    def __init__(self, scale: Tensor, amax: Tensor, fp8_dtype: Union[DType, torch.dtype], *,
                 rowwise: bool = True, columnwise: bool = True) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if not isinstance(scale, Tensor) or scale.numel() != 1:
            raise ValueError(f"Float8Quantizer: scale must be a one-element tensor, got "
                             f"{tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__}")
        if not isinstance(amax, Tensor) or amax.numel() != 1:
            raise ValueError(f"Float8Quantizer: amax must be a one-element tensor, got "
                             f"{tuple(amax.shape) if isinstance(amax, Tensor) else type(amax).__name__}")
        self.scale = scale
        self.amax = amax
        self.fp8_dtype = fp8_torch_dtype(fp8_dtype, "Float8Quantizer")

    def operand_of(self, x: Tensor) -> Float8Codes:
        codes, amax = self._cast(x, self.scale.to(x.device))
        self.record_amax(amax)
        return codes

    def calibrate(self, tensor: Tensor) -> None:
        self.record_amax(tensor_amax(tensor.detach()).reshape(1))

    def record_amax(self, amax: Tensor) -> None:
        """Max-accumulates an amax measured elsewhere (a producer that writes the codes itself)
        into the quantizer's statistics buffer (TE's amax pointer), which the recipe's scale
        update reads and resets."""
        self.amax.copy_(torch.maximum(self.amax.reshape(1), amax.to(self.amax.device)).reshape(self.amax.shape))


class Float8CurrentScalingQuantizer(_PerTensorQuantizer):
    """Current scaling: scale = fp8_max / max(amax(x), amax_epsilon), rounded down to a power
    of two with force_pow_2_scales; with_amax_reduction takes the amax over amax_reduction_group
    first (every rank then casts with the same scale). `scale` and `amax` hold the last cast's."""

    def __init__(self, fp8_dtype: Union[DType, torch.dtype], device=None, *, rowwise: bool = True,
                 columnwise: bool = True, use_existing_amax: bool = False, with_amax_reduction: bool = False,
                 amax_reduction_group=None, force_pow_2_scales: bool = False, amax_epsilon: float = 0.0) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.fp8_dtype = fp8_torch_dtype(fp8_dtype, "Float8CurrentScalingQuantizer")
        if amax_epsilon < 0:
            raise ValueError(f"Float8CurrentScalingQuantizer: amax_epsilon must be >= 0, got {amax_epsilon}")
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.amax = torch.zeros(1, dtype=torch.float32, device=device)
        self.use_existing_amax = use_existing_amax
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = force_pow_2_scales
        self.amax_epsilon = float(amax_epsilon)

    def operand_of(self, x: Tensor) -> Float8Codes:
        reduces = self.with_amax_reduction and dist.is_available() and dist.is_initialized()
        if not (self.use_existing_amax or reduces or (self.columnwise_usage and x.dim() == 2)):
            # The row-wise codes of x's own amax: one op (amax, scale and cast; the same rule).
            data, scale, scale_inv, amax = fp8_quantize_current(x, self.fp8_dtype, self.amax_epsilon,
                                                                self.force_pow_2_scales)
            self._keep(amax, scale, scale_inv)
            return Float8Codes(data, scale_inv)
        amax = self.amax.to(x.device) if self.use_existing_amax else tensor_amax(x).reshape(1)
        if reduces:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
        scale = current_scale(amax, torch.finfo(self.fp8_dtype).max, self.amax_epsilon, self.force_pow_2_scales)
        codes = self._cast(x, scale)[0]
        self._keep(amax, scale, codes.scale_inv)
        return codes

    def _keep(self, amax: Tensor, scale: Tensor, scale_inv: Tensor) -> None:
        """Where the last cast's amax [1] and scale [1] are kept (TE's quantizer attributes;
        scale_inv, 1 / scale as the cast computed it, is kept by the slot quantizers)."""
        self.amax, self.scale = amax, scale

    def __deepcopy__(self, memo) -> "Float8CurrentScalingQuantizer":
        """A copy with copies of the state tensors, reducing over the same process group (a
        handle to ranks, which cannot be copied: torch.distributed.checkpoint's asynchronous
        save copies FP8 weights under FSDP2, whose quantizers hold one)."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            clone.__dict__[name] = value if name == "amax_reduction_group" else copy.deepcopy(value, memo)
        return clone

    def share_scale_over(self, group) -> None:
        """Each cast takes the amax over `group` (an all-reduce, which every rank's write of its
        shard joins): the shards of a weight are cast with the whole weight's scale."""
        self.with_amax_reduction, self.amax_reduction_group = True, group
