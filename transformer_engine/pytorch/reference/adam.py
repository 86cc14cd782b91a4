"""One Adam/AdamW step over lists of tensors, with the op's exact signature, in plain PyTorch.

Per tensor, in float32 and in torch.optim.Adam/AdamW's order (p is the float32 master when
master_params is given, the param otherwise; a bf16/fp16 param then receives the master
rounded once):
    g = grad * inv_grad_scale            (+ weight_decay * p   for L2 Adam, adam_w_mode False)
    m = lerp(m, g, 1 - beta1);   v = beta2 * v + (1 - beta2) * g^2
    p = p * (1 - lr * weight_decay)      (AdamW)
    p = p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),   bc_i = 1 - beta_i^step (or 1)
All tensors are updated in place; nothing is returned.
"""
import math
from typing import List

import torch
from torch import Tensor


@torch.no_grad()
def adam_step(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
              master_params: List[Tensor], lr: float, beta1: float, beta2: float, eps: float, step: int,
              bias_correction: bool, weight_decay: float, adam_w_mode: bool, inv_grad_scale: float) -> None:
    bias_correction1 = 1 - beta1 ** step if bias_correction else 1.0
    bias_correction2 = 1 - beta2 ** step if bias_correction else 1.0
    step_size = lr / bias_correction1
    bias_correction2_sqrt = math.sqrt(bias_correction2)
    for k, (param, grad, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        p = master_params[k] if master_params else param.float()
        g = grad.float() * inv_grad_scale
        if not adam_w_mode:
            g = g + weight_decay * p
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if adam_w_mode:
            p.mul_(1 - lr * weight_decay)
        p.addcdiv_(m, v.sqrt() / bias_correction2_sqrt + eps, value=-step_size)
        if master_params or p is not param:
            param.copy_(p)
