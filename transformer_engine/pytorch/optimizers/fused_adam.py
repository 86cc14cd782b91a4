"""FusedAdam with TransformerEngine's signature: Adam/AdamW whose step is one multi-tensor
kernel call per param group (torch.ops.portable_te.multi_tensor_adam).

    opt = te.optimizers.FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss.backward(); opt.step(); opt.zero_grad()

Numerics are torch.optim.AdamW's (adam_w_mode=True, decoupled decay) or torch.optim.Adam's
(adam_w_mode=False, L2 decay added to the gradient), in float32. master_weights=True keeps a
float32 master copy of every param in the optimizer state (saved in state_dict); bf16/fp16
params then receive the master rounded once per step, so the master follows fp32 AdamW.
exp_avg_dtype / exp_avg_sq_dtype / master_weight_dtype other than float32 store those states
smaller (_adam_state.py): bf16 rounded once per step; fp16 and uint8 (FP8 E4M3) as TE's scaled
states, one float32 scale per tensor. Each step widens them to float32, runs the same update and
stores them again. store_param_remainders keeps only the low 16 bits of a bf16 param's float32
master (the param is the high half).

Params that are DTensors (FSDP2's fully_shard) are stepped on each rank's local shard; their
states are DTensors laid out as the params (torch.distributed.checkpoint saves them sharded),
except the one-element scales of scaled states, which stay each rank's own.
"""
from typing import Callable, Iterable, Optional, Union

import torch
from torch import Tensor

from ..custom_ops.adam import multi_tensor_adam
from ..fp8.quantized_tensor import QuantizedTensor
from ..dtensor import is_dtensor, like_dtensor, local_tensor, shard_group
from ._adam_state import STORED_DTYPES, master_from_remainder, remainder_of, stored_form, values
from ._closure import evaluate_closure

# State whose dtype is the optimizer's choice, not the param's (torch's load_state_dict would cast it).
_STATE = ("exp_avg", "exp_avg_sq", "master_param")
_MASTER_DTYPES = (torch.float32, torch.float16)


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
    """Adam/AdamW. Arguments as TransformerEngine's FusedAdam: lr, bias_correction, betas, eps,
    adam_w_mode, weight_decay, set_grad_none, master_weights, master_weight_dtype (float32 or
    float16), exp_avg_dtype / exp_avg_sq_dtype (float32, bfloat16, float16 or uint8 = FP8),
    use_decoupled_grad (read p.decoupled_grad instead of p.grad), store_param_remainders (bf16
    params with float32 masters; no effect otherwise, as in TE). capturable=True gives the same
    steps and, as TE's, takes torch.amp.GradScaler's scale into the step: the scaler then neither
    unscales the gradients (fp16 gradients of fp16 params included) nor skips the step itself;
    the step divides by the scale inside the kernel and is skipped when the scaler found an inf.
    The step count stays on the host, so a step cannot be captured in a CUDA graph (a capture
    raises). amsgrad raises.
    step(closure=None, grad_scale=None): grad_scale (a number or one-element tensor, e.g. a loss
    scale) divides every gradient inside the kernel. Params without a gradient are skipped.
    DTensor params (FSDP2) step their local shards; get_unscaled_state and set_scaled_state
    then take and give a shard's values.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
                 set_grad_none: bool = True, capturable: bool = False, master_weights: bool = False,
                 master_weight_dtype: torch.dtype = torch.float32, exp_avg_dtype: torch.dtype = torch.float32,
                 exp_avg_sq_dtype: torch.dtype = torch.float32, use_decoupled_grad: bool = False,
                 store_param_remainders: bool = False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weight_dtype not in _MASTER_DTYPES:
            raise ValueError(f"FusedAdam: master_weight_dtype must be torch.float32 or torch.float16, got "
                             f"{master_weight_dtype}")
        for name, dtype in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dtype not in STORED_DTYPES:
                raise ValueError(f"FusedAdam: {name} must be torch.float32, bfloat16, float16 or uint8 (FP8), "
                                 f"got {dtype}")
        _check_hyperparameters("", lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.master_weights = bool(master_weights)  # TE's tests pass a list of tensors to mean True
        self.use_decoupled_grad = use_decoupled_grad
        self.capturable = capturable
        # torch.amp.GradScaler.step then hands its scale and found_inf over as attributes (below).
        self._step_supports_amp_scaling = capturable
        self.store_param_remainders = store_param_remainders and master_weights and master_weight_dtype == torch.float32
        self._state_dtypes = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype,
                              "master_param": master_weight_dtype}

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

    def _keeps_remainder(self, p: Tensor) -> bool:
        return self.store_param_remainders and p.dtype == torch.bfloat16

    def _state_of(self, p: Tensor) -> dict:
        state = self.state[p]
        if not state:
            shard = local_tensor(p).detach()  # the param itself unless a DTensor
            group = shard_group(p) if is_dtensor(p) and isinstance(shard, QuantizedTensor) else None
            if group is not None:  # the steps re-cast each FP8 shard at the whole weight's scale (tensor/fsdp2.py)
                shard._get_quantizer().share_scale_over(group)
            for name in ("exp_avg", "exp_avg_sq"):  # each its own tensor (a float32 state is stored as given)
                self._store(p, state, name, torch.zeros_like(shard, dtype=torch.float32,
                                                             memory_format=torch.contiguous_format))
            if self._keeps_remainder(p):  # a bf16 value's low bits are 0
                state["master_param"] = like_dtensor(torch.zeros_like(shard, dtype=torch.int16), p)
            elif self.master_weights:
                self._store(p, state, "master_param", shard.to(torch.float32, copy=True).contiguous())
        return state

    def _store(self, p: Tensor, state: dict, name: str, value: Tensor) -> None:
        """state[name] := value (float32, p's local shape) in the state's dtype, its scale
        beside it when scaled."""
        stored, scale = stored_form(value, self._state_dtypes[name])
        if name not in state:
            state[name] = like_dtensor(stored, p)
        elif local_tensor(state[name]) is not value:
            local_tensor(state[name]).copy_(stored)
        if scale is not None:
            state[f"{name}_scale"] = scale

    def _values(self, p: Tensor, state: dict, name: str) -> Tensor:
        """A state's float32 values, p's local shape (the stored tensor itself when it is float32)."""
        stored = local_tensor(state[name])
        if name == "master_param" and self._keeps_remainder(p):
            return master_from_remainder(local_tensor(p).detach(), stored)
        return values(stored, state.get(f"{name}_scale"))

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None, grad_scale: Optional[Union[float, Tensor]] = None):
        if self.capturable and self._capturing():
            raise RuntimeError("FusedAdam: capturing a step in a CUDA graph is not supported (the step count is "
                               "kept on the host)")
        loss = evaluate_closure(closure)
        scaler_scale, found_inf = self._grad_scaler_handover()
        if found_inf:
            return loss  # the scaler saw an inf or NaN gradient: no step, as GradScaler.step would skip it
        inv_grad_scale = 1.0 if grad_scale is None else 1.0 / float(grad_scale)
        for group in self.param_groups:
            params = [p for p in group["params"] if self._grad(p) is not None]
            if not params:
                continue
            grads = [local_tensor(self._grad(p)) for p in params]
            if any(g.is_sparse for g in grads):
                raise RuntimeError("FusedAdam does not support sparse gradients")
            if scaler_scale is not None:
                # Unscaled in place, as GradScaler.unscale_ (and TE's capturable kernel) leave them;
                # the reciprocal taken in double as both take it.
                torch._foreach_mul_(grads, scaler_scale.double().reciprocal().float())
            states = [self._state_of(p) for p in params]
            group["step"] = group.get("step", 0) + 1  # a group loaded from an older state_dict may lack it
            beta1, beta2 = group["betas"]
            # The kernel updates float32 states: others go through float32 copies, stored again after.
            names = ("exp_avg", "exp_avg_sq") + (("master_param",) if self.master_weights else ())
            wide = {name: [self._values(p, s, name) for p, s in zip(params, states)] for name in names}
            multi_tensor_adam([local_tensor(p) for p in params], grads, wide["exp_avg"], wide["exp_avg_sq"],
                              wide.get("master_param", []),
                              float(group["lr"]), beta1, beta2, group["eps"], group["step"], group["bias_correction"],
                              group["weight_decay"], self.adam_w_mode, inv_grad_scale)
            for index, (p, state) in enumerate(zip(params, states)):
                for name in names:
                    if name == "master_param" and self._keeps_remainder(p):
                        local_tensor(state[name]).copy_(remainder_of(wide[name][index], local_tensor(p).detach()))
                    else:
                        self._store(p, state, name, wide[name][index])
        return loss

    def _capturing(self) -> bool:
        cuda_params = any(p.is_cuda for group in self.param_groups for p in group["params"])
        return cuda_params and torch.cuda.is_current_stream_capturing()

    def _grad_scaler_handover(self):
        """What torch.amp.GradScaler.step sets on an optimizer that unscales in its step
        (_step_supports_amp_scaling): grad_scale (None once the scaler has unscaled the
        gradients itself) and found_inf. (None, False) outside GradScaler.step."""
        scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        return scale, found_inf is not None and bool(found_inf.item())

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts floating state to each param's dtype, which would round the
        float32 moments and masters of bf16/fp16 params; they are restored from the saved values,
        in this optimizer's state dtypes."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            p = params[index]
            for key, value in saved.items():
                if key in _STATE or key.endswith("_scale"):
                    # The saved dtype is the state's own (scaled codes, int16 remainders, float32 scales).
                    self.state[p][key] = value.to(device=p.device, copy=True).contiguous()

    def initialize_state(self, param: Tensor, store_param_remainders: Optional[bool] = None) -> None:
        """Creates param's state now rather than at its first step (TE's API), e.g. to seed the
        master weight with set_scaled_state. store_param_remainders, when given, must be what
        this optimizer does for param (its option, for a bf16 param with float32 masters)."""
        keeps = self._keeps_remainder(param)
        if store_param_remainders is not None and bool(store_param_remainders) != keeps:
            raise ValueError(f"FusedAdam.initialize_state: store_param_remainders={store_param_remainders} for a "
                             f"{param.dtype} param, but this optimizer {'keeps' if keeps else 'does not keep'} "
                             f"remainders for it (store_param_remainders={self.store_param_remainders}, "
                             f"master_weights={self.master_weights})")
        self._state_of(param)

    def get_unscaled_state(self, param: Tensor, state_name: str) -> Tensor:
        """A param's state ('exp_avg', 'exp_avg_sq' or 'master_param') as float32 values (a
        DTensor param's: its local shard's)."""
        name = self._state_name(state_name)
        return self._values(param, self._state_of(param), name).clone()

    def set_scaled_state(self, param: Tensor, state_name: str, unscaled_state: Tensor) -> None:
        """Stores unscaled_state (float32 values of the param's local shape, or a DTensor laid
        out as the param) as a param's state, in that state's form."""
        name, state = self._state_name(state_name), self._state_of(param)
        shard = local_tensor(param)
        values_given = local_tensor(unscaled_state)
        if values_given.numel() != shard.numel():
            raise ValueError(f"FusedAdam.set_scaled_state: {state_name} values of shape {tuple(values_given.shape)} "
                             f"for a param whose local shape is {tuple(shard.shape)}")
        value = values_given.to(device=shard.device, dtype=torch.float32).reshape(shard.shape)
        if name == "master_param" and self._keeps_remainder(param):
            local_tensor(state[name]).copy_(remainder_of(value, shard.detach()))
        else:
            self._store(param, state, name, value)

    def _state_name(self, state_name: str) -> str:
        if state_name not in _STATE or (state_name == "master_param" and not self.master_weights):
            names = _STATE if self.master_weights else _STATE[:2]
            raise ValueError(f"FusedAdam: state_name must be one of {', '.join(names)}, got {state_name!r}")
        return state_name
