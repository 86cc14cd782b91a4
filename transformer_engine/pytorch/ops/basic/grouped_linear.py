"""te.ops.GroupedLinear: te.GroupedLinear as an op whose split sizes come as an extra input.

    y = op(x, split_sizes)                     # split_sizes: a list or an int tensor [num_groups]
    y = op(x, split_sizes, output=buf)         # y written into buf (and returned: it is buf)
    y = op(x, split_sizes, grad_input=buf)     # x's gradient also written into buf in backward
    y = op(x, split_sizes, scales)             # scale_bias=True: each token's bias times its scale
A Sequential passes those keywords from op_kwargs={op: {OUTPUT_BUFFER_KEY: buf, ...}}."""
from typing import Callable, Optional

import torch
from torch import Tensor

from ...module.grouped_linear import GroupedLinear as GroupedLinearModule
from ..op import BasicOperation

OUTPUT_BUFFER_KEY = "output"
GRAD_INPUT_BUFFER_KEY = "grad_input"


class _GradInto(torch.autograd.Function):
    """The identity; in backward, the gradient is also copied into `buffer`."""

    @staticmethod
    def forward(ctx, x: Tensor, buffer: Tensor) -> Tensor:
        ctx.buffer = buffer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.buffer.copy_(grad)
        return grad, None


def _check_buffer(name: str, buffer: Tensor, shape) -> None:
    if tuple(buffer.shape) != tuple(shape):
        raise ValueError(f"GroupedLinear: the {name} buffer has shape {tuple(buffer.shape)}, expected {tuple(shape)}")


class GroupedLinear(BasicOperation, GroupedLinearModule):
    num_extra_inputs = 1

    def __init__(self, num_groups: int, in_features: int, out_features: int, *, bias: bool = True, device=None,
                 dtype: Optional[torch.dtype] = None, rng_state_tracker_function: Optional[Callable] = None,
                 accumulate_into_main_grad: bool = False, single_grouped_weight: bool = False,
                 single_grouped_bias: bool = False, delay_wgrad_compute: bool = False,
                 scale_bias: bool = False) -> None:
        GroupedLinearModule.__init__(self, num_groups, in_features, out_features, bias=bias, params_dtype=dtype,
                                     device=device, get_rng_state_tracker=rng_state_tracker_function,
                                     fuse_wgrad_accumulation=accumulate_into_main_grad,
                                     single_grouped_weight=single_grouped_weight,
                                     single_grouped_bias=single_grouped_bias, delay_wgrad_compute=delay_wgrad_compute,
                                     return_bias=scale_bias and bias)
        self.scale_bias = scale_bias and bias
        self.num_extra_inputs = 2 if self.scale_bias else 1  # (split sizes[, per-token scales])

    def forward(self, x: Tensor, split_sizes, scales: Optional[Tensor] = None, output: Optional[Tensor] = None,
                grad_input: Optional[Tensor] = None) -> Tensor:
        if grad_input is not None:
            _check_buffer("grad_input", grad_input, x.shape)
            x = _GradInto.apply(x, grad_input)
        sizes = split_sizes.tolist() if isinstance(split_sizes, Tensor) else list(split_sizes)
        if not self.scale_bias:
            y = GroupedLinearModule.forward(self, x, sizes)
        else:
            if scales is None or scales.shape != (x.shape[0],):
                raise ValueError(f"GroupedLinear: scale_bias=True takes scales of shape ({x.shape[0]},) (one per "
                                 f"token), got {None if scales is None else tuple(scales.shape)}")
            y, biases = GroupedLinearModule.forward(self, x, sizes)
            per_token = torch.repeat_interleave(torch.stack(biases), torch.tensor(sizes, device=x.device), dim=0)
            y = y + per_token * scales.unsqueeze(-1).to(y.dtype)  # [tokens, out]
        if output is None:
            return y
        _check_buffer("output", output, y.shape)
        return output.copy_(y)  # the buffer itself, in the graph through copy_'s backward
