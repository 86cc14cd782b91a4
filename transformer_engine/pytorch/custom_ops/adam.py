"""The multi-tensor Adam step as a dispatcher op (schema in bindings/adam_ops.cpp):

    multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps,
                      step, bias_correction, weight_decay, adam_w_mode, inv_grad_scale) -> ()

It updates params, exp_avgs, exp_avg_sqs (and master_params, when not empty) in place, all
tensors of the lists in one parallel loop. Formula: reference/adam.py. An optimizer step is not
differentiated, so the op has no autograd rule.

The argument checks below are bindings/adam_ops.cpp's, in Python, with its messages: run by the
fake kernel and before the Triton kernel or the reference on accelerators. Only metadata is
read: fake and meta tensors are checked in full.
"""
from typing import List

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _checks
from ._checks import fail, shape_text
from ._registry import serve_on_accelerators

_ops = getattr(torch.ops, NAMESPACE)

# --- argument checks (bindings/adam_ops.cpp's) ---------------------------------------------
_OP = "multi_tensor_adam"


def _state(list_name: str, k: int, t: Tensor, param: Tensor) -> None:
    """A moment or master: float32, contiguous (updated in place), one value per param element."""
    arg = f"{list_name}[{k}]"
    _checks.same_device(_OP, arg, t, "its param", param)
    _checks.dtype(_OP, arg, t, torch.float32)
    if t.numel() != param.numel():
        fail(_OP, f"{arg} has shape {shape_text(t.shape)} but its param has shape {shape_text(param.shape)}")
    if not t.is_contiguous():
        fail(_OP, f"{arg} must be contiguous (it is updated in place)")


def _check_multi_tensor_adam(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor],
                             exp_avg_sqs: List[Tensor], master_params: List[Tensor], lr, beta1, beta2, eps, step,
                             bias_correction, weight_decay, adam_w_mode, inv_grad_scale) -> None:
    n = len(params)
    if not len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n:
        fail(_OP, f"params, grads, exp_avgs and exp_avg_sqs must have one entry per param, got {n}, {len(grads)}, "
                  f"{len(exp_avgs)} and {len(exp_avg_sqs)}")
    if master_params and len(master_params) != n:
        fail(_OP, f"master_params must be empty or have one entry per param, got {len(master_params)} for {n} params")
    if step < 1:
        fail(_OP, f"step counts from 1, got {step}")
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        fail(_OP, f"betas must be in [0, 1), got ({beta1:g}, {beta2:g})")  # :g prints doubles as C++ streams do
    for k, (param, grad) in enumerate(zip(params, grads)):
        name, grad_name = f"params[{k}]", f"grads[{k}]"
        _checks.kernel_dtype(_OP, name, param)
        if param.dtype == torch.float64:
            fail(_OP, f"{name} is float64; float32, bfloat16 and float16 params are supported")
        if not param.is_contiguous():
            fail(_OP, f"{name} (shape {shape_text(param.shape)}) must be contiguous")
        _checks.same_device(_OP, grad_name, grad, name, param)
        _checks.kernel_dtype(_OP, grad_name, grad)
        if grad.dtype == torch.float64:
            fail(_OP, f"{grad_name} is float64")
        if grad.shape != param.shape:
            fail(_OP, f"{grad_name} has shape {shape_text(grad.shape)} but {name} has shape {shape_text(param.shape)}")
        _state("exp_avgs", k, exp_avgs[k], param)
        _state("exp_avg_sqs", k, exp_avg_sqs[k], param)
        if master_params:
            _state("master_params", k, master_params[k], param)


@torch.library.register_fake(f"{NAMESPACE}::multi_tensor_adam")
def _multi_tensor_adam_fake(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps, step,
                            bias_correction, weight_decay, adam_w_mode, inv_grad_scale):
    _check_multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps, step,
                             bias_correction, weight_decay, adam_w_mode, inv_grad_scale)
    return None


serve_on_accelerators("multi_tensor_adam", reference.adam_step, triton_module="adam",
                      check=_check_multi_tensor_adam)


def multi_tensor_adam(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                      master_params: List[Tensor], lr: float, beta1: float, beta2: float, eps: float, step: int,
                      bias_correction: bool = True, weight_decay: float = 0.0, adam_w_mode: bool = True,
                      inv_grad_scale: float = 1.0) -> None:
    """One Adam (adam_w_mode False: L2 decay) or AdamW step of every tensor, in place."""
    _ops.multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps, step,
                           bias_correction, weight_decay, adam_w_mode, inv_grad_scale)
