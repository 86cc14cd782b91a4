"""The multi-tensor Adam step as a dispatcher op (schema in bindings/schemas.cpp):

    multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps,
                      step, bias_correction, weight_decay, adam_w_mode, inv_grad_scale) -> ()

It updates params, exp_avgs, exp_avg_sqs (and master_params, when not empty) in place, all
tensors of the lists in one parallel loop. Formula: reference/adam.py; argument checks, as the
compiled op's, in kernels/_adam_checks.py. An optimizer step is not differentiated, so the op has
no autograd rule.
"""
from typing import List

import torch
from torch import Tensor

from .. import reference
from .._extension import NAMESPACE
from . import _adam_checks
from ._registry import serve_reference_where_no_kernel

_ops = getattr(torch.ops, NAMESPACE)


@torch.library.register_fake(f"{NAMESPACE}::multi_tensor_adam")
def _multi_tensor_adam_fake(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps, step,
                            bias_correction, weight_decay, adam_w_mode, inv_grad_scale):
    _adam_checks.multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps, step,
                                   bias_correction, weight_decay, adam_w_mode, inv_grad_scale)
    return None


serve_reference_where_no_kernel("multi_tensor_adam", reference.adam_step, triton_module="adam",
                                check=_adam_checks.multi_tensor_adam)


def multi_tensor_adam(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                      master_params: List[Tensor], lr: float, beta1: float, beta2: float, eps: float, step: int,
                      bias_correction: bool = True, weight_decay: float = 0.0, adam_w_mode: bool = True,
                      inv_grad_scale: float = 1.0) -> None:
    """One Adam (adam_w_mode False: L2 decay) or AdamW step of every tensor, in place."""
    _ops.multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs, master_params, lr, beta1, beta2, eps, step,
                           bias_correction, weight_decay, adam_w_mode, inv_grad_scale)
