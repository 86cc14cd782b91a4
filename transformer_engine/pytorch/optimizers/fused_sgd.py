"""SGD with momentum, TransformerEngine's te.optimizers.FusedSGD: torch.optim.SGD's update,
all tensors of a param group updated together by PyTorch's multi-tensor (_foreach) ops.

Per param, with g its gradient (divided by grad_scale when given) and v its momentum buffer:
    g += weight_decay * p                       (before momentum, unless wd_after_momentum)
    v  = g on the first step, else momentum * v + (1 - dampening) * g
    g  = g + momentum * v (nesterov), else v
    g += weight_decay * p                       (after momentum, with wd_after_momentum)
    p -= lr * g
in float32 whatever the param's dtype: the param and the momentum buffer (kept in the param's
dtype, as torch.optim.SGD and TE keep it) rounded once each. The step applies the buffer as
stored, rounded, as torch.optim.SGD does (TE's CUDA kernel applies it before rounding; TE's own
test holds FusedSGD to torch.optim.SGD, which for fp16 params is bit-equal only this way).
There is no kernel of ours here: the foreach ops are PyTorch's (one launch per op over a
group's tensors on GPUs).
"""
from typing import Callable, Iterable, List, Optional, Union

import torch
from torch import Tensor

from ._closure import evaluate_closure


def _check(where: str, lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool) -> None:
    if lr < 0.0:
        raise ValueError(f"FusedSGD{where}: invalid learning rate: {lr}")
    if momentum < 0.0:
        raise ValueError(f"FusedSGD{where}: invalid momentum value: {momentum}")
    if weight_decay < 0.0:
        raise ValueError(f"FusedSGD{where}: invalid weight_decay value: {weight_decay}")
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        raise ValueError(f"FusedSGD{where}: Nesterov momentum requires a momentum and zero dampening, got "
                         f"momentum={momentum}, dampening={dampening}")


class FusedSGD(torch.optim.Optimizer):
    """SGD (momentum, dampening, Nesterov, L2 weight decay) with TransformerEngine's arguments;
    wd_after_momentum adds the decay after the momentum. materialize_master_grads and
    set_grad_none are accepted for TE's signature (there are no master gradients here)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: Optional[bool] = None):
        _check("", lr, momentum, dampening, weight_decay, nesterov)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        self.set_grad_none = set_grad_none

    def add_param_group(self, param_group: dict) -> None:
        group = {**self.defaults, **param_group}
        _check(f" (param group {len(self.param_groups)})", group["lr"], group["momentum"], group["dampening"],
               group["weight_decay"], group["nesterov"])
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Drops the gradients (the default, or set_grad_none's choice) or zeroes them."""
        set_to_none = (True if self.set_grad_none is None else self.set_grad_none) if set_to_none is None \
            else set_to_none
        super().zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None, grad_scale: Optional[Union[float, Tensor]] = None):
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params, 1.0 if grad_scale is None else 1.0 / float(grad_scale))
        return loss

    def _update(self, group: dict, params: List[Tensor], inv_grad_scale: float) -> None:
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError("FusedSGD does not support sparse gradients")
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        values = [p.float() for p in params]  # the params themselves where they are float32
        grads = torch._foreach_mul([p.grad.float() for p in params], inv_grad_scale)
        if weight_decay and not self.wd_after_momentum:
            torch._foreach_add_(grads, values, alpha=weight_decay)
        if momentum:
            grads = self._momentum(group, params, grads)
        if weight_decay and self.wd_after_momentum:  # out of place: grads may be the momentum buffers
            grads = torch._foreach_add(grads, values, alpha=weight_decay)
        torch._foreach_add_(values, grads, alpha=-group["lr"])
        for p, value in zip(params, values):
            if value is not p:
                p.copy_(value)  # one rounding to the param's dtype

    def _momentum(self, group: dict, params: List[Tensor], grads: List[Tensor]) -> List[Tensor]:
        """The buffers updated with grads (in float32, then stored rounded); what the step then
        applies (grads, or the stored buffers in float32)."""
        momentum, dampening = group["momentum"], group["dampening"]
        buffers = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if "momentum_buffer" not in state:  # the first step: v = g
                state["momentum_buffer"] = g.to(p.dtype, copy=True)
            else:
                buffer = state["momentum_buffer"].float().mul_(momentum).add_(g, alpha=1.0 - dampening)
                state["momentum_buffer"].copy_(buffer)
            buffers.append(state["momentum_buffer"].float())  # the buffer itself when float32
        if group["nesterov"]:
            return torch._foreach_add(grads, buffers, alpha=momentum)
        return buffers
