"""The fused operations (see the package docstring for which kernels each uses)."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..._autocast import autocast_input
from ...custom_ops.activation import activation
from ...custom_ops.norm import add_rmsnorm
from ...module._fused_fp8 import activation_to_fp8, producer_writes_fp8
from ...module._norm_choice import normalize
from ..basic.linear import Bias, Linear
from ..basic.norm import RMSNorm
from ..op import FusedOperation


def _gemm(linear: Linear, x: Tensor, extra_bias: Optional[Tensor], producer=None,
          producer_params: Tuple[Optional[Tensor], ...] = ()) -> Tensor:
    """linear's GEMM of x [..., in] -> [..., out], the bias (its own, else extra_bias) in the
    epilogue; `producer(x2d, fp8)`, when given, makes the GEMM input and its call (a norm or
    activation that may write the FP8 operand itself: _fused_fp8.py) from x [tokens, in], with
    its parameters producer_params."""
    x = autocast_input(linear.in_op_dtype(x))
    weight, bias = linear.weight_and_bias()
    if bias is None and extra_bias is not None:
        bias = extra_bias
    elif extra_bias is not None:
        bias = bias + extra_bias
    x2d = x.reshape(-1, x.shape[-1])  # [..., k] -> [tokens, k]
    y = linear.gemm(x2d, weight, bias, producer=producer, producer_params=producer_params)
    return y.reshape(linear.output_shape(x))  # [tokens, out] -> [..., out]


class ForwardNormLinear(FusedOperation):
    def forward(self, x: Tensor) -> Tensor:
        norm, linear, *bias_op = self._basic_ops
        rms = isinstance(norm, RMSNorm)
        if x.shape[-1] != linear.in_features:
            raise ValueError(f"{type(linear).__name__}: input of shape {tuple(x.shape)} does not end in "
                             f"in_features={linear.in_features}")

        def norm_to_gemm_input(x2d: Tensor, fp8):
            return normalize(x2d, norm.weight.reshape(-1), None if rms else norm.bias.reshape(-1),
                             "RMSNorm" if rms else "LayerNorm", norm.eps, norm.zero_centered_gamma, fp8, False)
        return _gemm(linear, x, bias_op[0].bias if bias_op else None, norm_to_gemm_input,
                     (norm.weight, None if rms else norm.bias))


class ForwardLinearBiasActivation(FusedOperation):
    """A Linear (its own bias, or a Bias op's, in the epilogue), then an optional activation."""

    def forward(self, x: Tensor) -> Tensor:
        linear, *rest = self._basic_ops
        bias_op = rest.pop(0) if rest and isinstance(rest[0], Bias) else None
        y = _gemm(linear, x, bias_op.bias if bias_op is not None else None)
        return rest[0](y) if rest else y


class BackwardActivationBias(FusedOperation):
    def forward(self, x: Tensor) -> Tensor:
        bias_op, act = self._basic_ops
        return activation(x, act.kind, bias_op.bias.to(x.dtype), act.limit, act.alpha)


class ForwardActivationLinear(FusedOperation):
    def forward(self, x: Tensor) -> Tensor:
        act, linear = self._basic_ops

        def activation_to_gemm_input(h: Tensor, fp8):
            if producer_writes_fp8(fp8):
                return activation_to_fp8(h, act.kind, act.limit, act.alpha, fp8)
            return act(h), fp8
        return _gemm(linear, x, None, activation_to_gemm_input)


class ForwardLinearBiasAdd(FusedOperation):
    def forward(self, x: Tensor, extra: Tensor) -> Tensor:
        linear, *middle, _add = self._basic_ops
        return _gemm(linear, x, middle[0].bias if middle else None) + extra


class ForwardLinearScaleAdd(FusedOperation):
    def forward(self, x: Tensor, extra: Tensor) -> Tensor:
        linear, scale, _add = self._basic_ops
        return _gemm(linear, x, None) * scale.scale + extra


class _Grouped(FusedOperation):
    """The ops one after the other (no kernel fusion here; see the package docstring)."""

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        extra_outputs = []
        for op in self._basic_ops:
            out = op(x)
            if op.num_extra_outputs:
                x, *more = out
                extra_outputs += more
            else:
                x = out
        return (x, *extra_outputs) if extra_outputs else x


class BackwardLinearAdd(_Grouped):
    pass


class BackwardLinearScale(_Grouped):
    pass


class BackwardAddRMSNorm(FusedOperation):
    """(RMSNorm(x), x) on the residual + RMSNorm kernel with a zero residual: its backward adds
    the extra output's gradient to the norm's input gradient in fp32, before the one rounding."""

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        _make_extra_output, norm = self._basic_ops
        flat = norm.norm_input(x)  # [..., *normalized_shape] -> [..., hidden], checked, autocast
        y, same = add_rmsnorm(flat, torch.zeros_like(flat), norm.weight.reshape(-1), norm.eps,
                              norm.zero_centered_gamma)
        return y.view(x.shape), same.view(x.shape)


