"""te.ops.BasicLinear (y = x W^T), te.ops.Bias (y = x + b) and te.ops.Linear (both): the
te.Linear module's GEMM, FP8 under te.autocast as te.Linear is, with TE's op arguments."""
from typing import Callable, Optional

import torch
from torch import Tensor

from ...fp8.global_state import FP8GlobalStateManager
from ...module.linear import Linear as LinearModule
from ...parallel.collectives import group_size
from ...utils import check_module_input, default_device
from ..op import BasicOperation


class Linear(BasicOperation, LinearModule):
    """y = x W^T + b (bias=False: no b). Parameters weight [out, in], bias [out];
    accumulate_into_main_grad: weight gradients go to weight.main_grad.
    tensor_parallel_mode 'column' / 'row' splits in_features / out_features (the full sizes)
    over tensor_parallel_group (None: the world group, as TE's ops take it), te.Linear's modes;
    sequence_parallel as there. Row-parallel, each rank adds its own bias to its partial product
    before the sum over the ranks (TE's op: y = sum_r (x_r W_r^T + b_r))."""
    row_bias_after_sum = False

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, device=None,
                 dtype: Optional[torch.dtype] = None, tensor_parallel_mode: Optional[str] = None,
                 tensor_parallel_group=None, sequence_parallel: bool = False,
                 rng_state_tracker_function: Optional[Callable] = None, rng_tracker_name: Optional[str] = None,
                 accumulate_into_main_grad: bool = False, userbuffers_options: Optional[dict] = None) -> None:
        LinearModule.__init__(self, in_features, out_features, bias=bias, params_dtype=dtype, device=device,
                              parallel_mode=tensor_parallel_mode, tp_group=tensor_parallel_group,
                              tp_size=group_size(tensor_parallel_group) if tensor_parallel_mode else 1,
                              sequence_parallel=sequence_parallel, get_rng_state_tracker=rng_state_tracker_function,
                              rng_tracker_name=rng_tracker_name, fuse_wgrad_accumulation=accumulate_into_main_grad)

    def forward(self, inp: Tensor) -> Tensor:
        """inp [..., in] -> [..., out] in the op's dtype (its weight's), as TE's ops compute;
        inside torch.autocast, in autocast's dtype."""
        return LinearModule.forward(self, self.in_op_dtype(inp))

    def in_op_dtype(self, inp: Tensor) -> Tensor:
        if torch.is_autocast_enabled(inp.device.type) or not inp.is_floating_point():
            return inp
        return inp.to(self.weight.dtype)

    def describe_context(self, ctx, input_: Tensor) -> None:
        """TE's BasicLinear context: saved (input, weight), the compute dtype, whether FP8 ran."""
        ctx.save_for_backward(input_, self.weight)
        ctx.dtype = self.in_op_dtype(input_).dtype
        ctx.with_quantized_compute = FP8GlobalStateManager.is_fp8_enabled()
        ctx.input_requires_grad = True
        ctx.weight_requires_grad = self.weight.requires_grad

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        """dx = dy W, dW = dy^T x (db = the sum of dy) in high precision from a context holding
        (input, weight); a context of quantized compute is refused (its operands are not there)."""
        if vars(ctx).get("with_quantized_compute", False):
            raise NotImplementedError(f"{type(self).__name__}: a backward from a context a forward fusion wrote "
                                      f"runs in high precision; this one says with_quantized_compute")
        x, weight = ctx.saved_tensors
        dy = grad_output.reshape(-1, grad_output.shape[-1])  # [..., out] -> [tokens, out]
        grad_input = (dy @ weight.to(dy.dtype)).reshape(x.shape)
        grads = {"weight": (dy.t() @ x.reshape(-1, x.shape[-1]).to(dy.dtype)).to(weight.dtype)}
        if self.use_bias:
            grads["bias"] = dy.sum(0).to(self.bias.dtype)
        return grad_input, tuple(grads.get(name) for name, _ in self.named_parameters(recurse=False)), ()


class BasicLinear(Linear):
    """y = x W^T: Linear without a bias (TE's basic GEMM op)."""

    def __init__(self, in_features: int, out_features: int, **kwargs) -> None:
        super().__init__(in_features, out_features, bias=False, **kwargs)


class Bias(BasicOperation):
    """y = x + b over the last dimension; parameter bias [size], zero at start."""

    def __init__(self, size: int, *, device=None, dtype: Optional[torch.dtype] = None, tensor_parallel: bool = False,
                 tensor_parallel_group=None) -> None:
        super().__init__()
        if size <= 0:
            raise ValueError(f"Bias: size must be positive, got {size}")
        factory = {"dtype": dtype or torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        self.bias = torch.nn.Parameter(torch.zeros(size, **factory))

    def forward(self, x: Tensor) -> Tensor:
        check_module_input("Bias", "x", x)
        if x.shape[-1] != self.bias.shape[0]:
            raise ValueError(f"Bias: input of shape {tuple(x.shape)} does not end in size={self.bias.shape[0]}")
        return x + self.bias.to(x.dtype)

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        return grad_output, (grad_output.reshape(-1, grad_output.shape[-1]).sum(0).to(self.bias.dtype),), ()
