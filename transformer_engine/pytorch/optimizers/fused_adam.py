"""FusedAdam with TransformerEngine's signature: Adam/AdamW whose step is one multi-tensor
kernel call per param group (torch.ops.portable_te.multi_tensor_adam).

    opt = te.optimizers.FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss.backward(); opt.step(); opt.zero_grad()

Numerics are torch.optim.AdamW's (adam_w_mode=True, decoupled decay) or torch.optim.Adam's
(adam_w_mode=False, L2 decay added to the gradient), in float32. master_weights=True keeps a
float32 master copy of every param in the optimizer state (saved in state_dict); bf16/fp16
params then receive the master rounded once per step, so the master follows fp32 AdamW.
exp_avg_dtype / exp_avg_sq_dtype=torch.bfloat16 keep the moments in bf16 (half the state
memory): each step widens them to float32, runs the same update and rounds them once on store.
TE's scaled fp16 and FP8 (uint8) moment states are not implemented.
"""
from typing import Callable, Iterable, Optional, Union

import torch
from torch import Tensor

from ..kernels.adam import multi_tensor_adam
from ._closure import evaluate_closure

# State whose dtype is the optimizer's choice, not the param's (torch's load_state_dict would cast it).
_STATE = ("exp_avg", "exp_avg_sq", "master_param")
_MOMENT_DTYPES = (torch.float32, torch.bfloat16)


def _unsupported(name: str, value, supported) -> None:
    if value != supported:
        raise NotImplementedError(f"FusedAdam: {name}={value!r} is not supported (only {supported!r})")


def _check_hyperparameters(where: str, lr, betas, eps, weight_decay) -> None:
    """torch.optim.Adam's checks (written so that NaN fails each of them)."""
    if not 0.0 <= lr:
        raise ValueError(f"FusedAdam{where}: invalid learning rate: {lr} (must be >= 0)")
    if not 0.0 <= eps:
        raise ValueError(f"FusedAdam{where}: invalid epsilon value: {eps} (must be >= 0)")
    if not 0.0 <= weight_decay:
        raise ValueError(f"FusedAdam{where}: invalid weight_decay value: {weight_decay} (must be >= 0)")
    if len(betas) != 2:
        raise ValueError(f"FusedAdam{where}: betas must be a pair (beta1, beta2), got {betas!r}")
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"FusedAdam{where}: invalid beta parameter at index {index}: {beta} (must be in [0, 1))")


class FusedAdam(torch.optim.Optimizer):
    """Adam/AdamW. Arguments as TransformerEngine's FusedAdam; supported: lr, bias_correction,
    betas, eps, adam_w_mode, weight_decay, set_grad_none, master_weights, use_decoupled_grad
    (read p.decoupled_grad instead of p.grad). amsgrad, capturable, store_param_remainders and
    non-float32 state dtypes raise.
    step(closure=None, grad_scale=None): grad_scale (a number or one-element tensor, e.g. a loss
    scale) divides every gradient inside the kernel. Params without a gradient are skipped.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
                 set_grad_none: bool = True, capturable: bool = False, master_weights: bool = False,
                 master_weight_dtype: torch.dtype = torch.float32, exp_avg_dtype: torch.dtype = torch.float32,
                 exp_avg_sq_dtype: torch.dtype = torch.float32, use_decoupled_grad: bool = False,
                 store_param_remainders: bool = False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        _unsupported("capturable", capturable, False)
        _unsupported("store_param_remainders", store_param_remainders, False)
        _unsupported("master_weight_dtype", master_weight_dtype, torch.float32)
        for name, dtype in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dtype not in _MOMENT_DTYPES:
                raise NotImplementedError(f"FusedAdam: {name}={dtype} is not supported (torch.float32 or "
                                          "torch.bfloat16; TE's scaled fp16 and FP8 states are not implemented)")
        _check_hyperparameters("", lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.master_weights = master_weights
        self.use_decoupled_grad = use_decoupled_grad
        self._state_dtypes = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype, "master_param": torch.float32}

    def add_param_group(self, param_group: dict) -> None:
        """torch's, after checking the group's own hyperparameters; every group carries its
        step count from the start (0 until one of its params first has a gradient), so that
        code reading group["step"] (checkpoint converters) finds it in groups never stepped."""
        group = {**self.defaults, **param_group}
        _check_hyperparameters(f" (param group {len(self.param_groups)})", group["lr"], group["betas"], group["eps"],
                               group["weight_decay"])
        super().add_param_group(param_group)
        self.param_groups[-1].setdefault("step", 0)

    def _grad(self, p: Tensor) -> Optional[Tensor]:
        return getattr(p, "decoupled_grad", None) if self.use_decoupled_grad else p.grad

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Drops the gradients (set_grad_none, the default) or zeroes them."""
        set_to_none = self.set_grad_none if set_to_none is None else set_to_none
        if self.use_decoupled_grad:
            for group in self.param_groups:
                for p in group["params"]:
                    if getattr(p, "decoupled_grad", None) is not None:
                        if set_to_none:
                            p.decoupled_grad = None
                        else:
                            p.decoupled_grad.zero_()
            return
        super().zero_grad(set_to_none=set_to_none)

    def _state_of(self, p: Tensor) -> dict:
        state = self.state[p]
        if not state:
            for name in ("exp_avg", "exp_avg_sq"):
                state[name] = torch.zeros_like(p, dtype=self._state_dtypes[name], memory_format=torch.contiguous_format)
            if self.master_weights:
                state["master_param"] = p.detach().to(torch.float32, memory_format=torch.contiguous_format,
                                                      copy=True)
        return state

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None, grad_scale: Optional[Union[float, Tensor]] = None):
        loss = evaluate_closure(closure)
        inv_grad_scale = 1.0 if grad_scale is None else 1.0 / float(grad_scale)
        for group in self.param_groups:
            params = [p for p in group["params"] if self._grad(p) is not None]
            if not params:
                continue
            grads = [self._grad(p) for p in params]
            if any(g.is_sparse for g in grads):
                raise RuntimeError("FusedAdam does not support sparse gradients")
            states = [self._state_of(p) for p in params]
            group["step"] = group.get("step", 0) + 1  # a group loaded from an older state_dict may lack it
            beta1, beta2 = group["betas"]
            # The kernel updates float32 moments: 16-bit ones go through float32 copies, rounded once on store.
            exp_avgs, exp_avg_sqs = ([s[name].float() for s in states] for name in ("exp_avg", "exp_avg_sq"))
            multi_tensor_adam(params, grads, exp_avgs, exp_avg_sqs,
                              [s["master_param"] for s in states] if self.master_weights else [],
                              group["lr"], beta1, beta2, group["eps"], group["step"], group["bias_correction"],
                              group["weight_decay"], self.adam_w_mode, inv_grad_scale)
            for state, exp_avg, exp_avg_sq in zip(states, exp_avgs, exp_avg_sqs):
                for name, value in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                    if value is not state[name]:
                        state[name].copy_(value)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts floating state to each param's dtype, which would round the
        float32 moments and masters of bf16/fp16 params; they are restored from the saved values,
        in this optimizer's state dtypes."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            p = params[index]
            for key in _STATE:
                if key in saved:
                    self.state[p][key] = saved[key].to(device=p.device, dtype=self._state_dtypes[key],
                                                       copy=True).contiguous()

    def get_unscaled_state(self, param: Tensor, state_name: str) -> Tensor:
        """A param's state ('exp_avg', 'exp_avg_sq' or 'master_param') in float32 (TE's API: its
        scaled states are returned unscaled; ours are stored unscaled)."""
        return self._state_of(param)[self._state_name(state_name)].float()

    def set_scaled_state(self, param: Tensor, state_name: str, unscaled_state: Tensor) -> None:
        """Stores unscaled_state as a param's state, in that state's dtype."""
        self._state_of(param)[self._state_name(state_name)].copy_(unscaled_state)

    def _state_name(self, state_name: str) -> str:
        if state_name not in _STATE or (state_name == "master_param" and not self.master_weights):
            names = _STATE if self.master_weights else _STATE[:2]
            raise ValueError(f"FusedAdam: state_name must be one of {', '.join(names)}, got {state_name!r}")
        return state_name
