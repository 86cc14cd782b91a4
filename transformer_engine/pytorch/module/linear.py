"""te.Linear: TransformerEngine's Linear, in high precision or, inside te.autocast, in FP8.

FP8 (every recipe): the input and weight are cast to the forward format (E4M3), the
gradient of the output to the backward format (E5M2 under HYBRID), per tensor or in the
blocks of Float8BlockScaling / MXFP8BlockScaling; the GEMMs multiply the dequantised operands
with fp32 accumulation (ops/fp8_gemm.py); the input is saved for the weight gradient in
FP8, so the activation memory is a quarter of fp32's.
"""
from typing import Callable, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..fp8.context import current_context, defer_forward_update
from ..fp8.model_init import fp8_weight_layout, weight_quantization_in_force
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta, Fp8Operand
from ..ops.fp8_gemm import fp8_gemm, linear
from ..utils import default_device

# fp8_meta slots of a Linear (TransformerEngine's order).
INPUT, WEIGHT, OUTPUT = 0, 1, 2
GRAD_OUTPUT, GRAD_INPUT = 0, 1


class _Fp8Call:
    """What one FP8 forward needs besides tensors: the module's state and its weight cache."""

    def __init__(self, meta: Fp8Meta, weight_fp8: Optional[Fp8Operand], record_weight_amax: bool,
                 needs_backward: bool):
        self.meta = meta
        self.weight_fp8 = weight_fp8
        self.record_weight_amax = record_weight_amax
        self.needs_backward = needs_backward  # decided outside: autograd.Function.forward runs without grad


class _LinearFunction(torch.autograd.Function):
    """y = x @ W.T + b over x [tokens, in] and W [out, in]; FP8 when fp8 is given.

    fuse_wgrad_accumulation: the weight gradient is added to weight.main_grad and None is
    returned for it, so weight.grad stays None.
    deferred_wgrad: a list; when given, the weight (and bias) gradient is not computed in
    backward but appended to it as a closure, for Linear.backward_dw() to run later.
    """

    @staticmethod
    def forward(ctx, inp: Tensor, weight: Tensor, bias: Optional[Tensor], fp8: Optional[_Fp8Call],
                fuse_wgrad_accumulation: bool, main_grad: Optional[Tensor], deferred_wgrad: Optional[list]):
        ctx.fp8 = fp8
        ctx.deferred_wgrad = deferred_wgrad
        ctx.params = (weight, bias) if deferred_wgrad is not None else None
        ctx.has_bias = bias is not None
        ctx.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        ctx.main_grad = main_grad
        ctx.input_dtype = inp.dtype
        ctx.weight_dtype = weight.dtype
        if fp8 is None:
            ctx.save_for_backward(inp, weight)
            return linear(inp, weight.to(inp.dtype), bias.to(inp.dtype) if bias is not None else None)
        # The backward needs x^T (wgrad) and W^T (dgrad): both come out of the casts' pass.
        training = fp8.needs_backward
        inp_fp8 = fp8.meta.quantize(inp, FORWARD, INPUT, with_transpose=training)
        weight_fp8 = fp8.weight_fp8 or fp8.meta.quantize(weight, FORWARD, WEIGHT, record_amax=fp8.record_weight_amax,
                                                         with_transpose=training)
        fp8.weight_fp8 = weight_fp8
        if training:  # only the transposed layouts are used later: keep just those, in FP8
            (inp_t_tensors, ctx.rebuild_inp_t), (weight_t_tensors, ctx.rebuild_weight_t) = (inp_fp8.t().saved(),
                                                                                              weight_fp8.t().saved())
            ctx.inp_t_count = len(inp_t_tensors)
            ctx.save_for_backward(*inp_t_tensors, *weight_t_tensors)
        return fp8_gemm(inp_fp8, weight_fp8, inp.dtype, bias)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        dtype = ctx.input_dtype
        if ctx.fp8 is None:
            inp, weight = ctx.saved_tensors
            grad_input = linear(grad_output, weight.to(dtype).t())  # [tokens, out] x [in, out]^T

            def wgrad():
                return linear(grad_output.t(), inp.t())  # [out, tokens] x [in, tokens]^T
        else:
            saved = ctx.saved_tensors
            meta = ctx.fp8.meta
            inp_t = ctx.rebuild_inp_t(*saved[:ctx.inp_t_count])  # [in, tokens]
            weight_t = ctx.rebuild_weight_t(*saved[ctx.inp_t_count:])  # [in, out]
            grad_fp8 = meta.quantize(grad_output, BACKWARD, GRAD_OUTPUT, with_transpose=True)
            grad_input = fp8_gemm(grad_fp8, weight_t, dtype)  # [tokens, out] x [in, out]^T
            meta.update(BACKWARD)

            def wgrad():
                return fp8_gemm(grad_fp8.t(), inp_t, torch.float32)  # [out, tokens] x [in, tokens]^T

        def grad_bias():
            return grad_output.sum(dim=0) if ctx.has_bias else None
        if ctx.deferred_wgrad is not None:
            weight, bias = ctx.params
            ctx.deferred_wgrad.append(lambda: _accumulate_wgrad(ctx, weight, bias, wgrad(), grad_bias()))
            return grad_input, None, None, None, None, None, None
        grad_weight = wgrad()
        if ctx.fuse_wgrad_accumulation:
            ctx.main_grad.add_(grad_weight.to(ctx.main_grad.dtype))
            grad_weight = None
        else:
            grad_weight = grad_weight.to(ctx.weight_dtype)
        return grad_input, grad_weight, grad_bias(), None, None, None, None


def _accumulate_wgrad(ctx, weight: Tensor, bias: Optional[Tensor], grad_weight: Tensor,
                      grad_bias: Optional[Tensor]) -> None:
    """What autograd would have done with the deferred gradients: add them to main_grad
    (fuse_wgrad_accumulation) or to .grad."""
    if ctx.fuse_wgrad_accumulation:
        ctx.main_grad.add_(grad_weight.to(ctx.main_grad.dtype))
    else:
        _add_grad(weight, grad_weight)
    if bias is not None:
        _add_grad(bias, grad_bias)


def _add_grad(param: Tensor, grad: Tensor) -> None:
    grad = grad.to(param.dtype)
    param.grad = grad if param.grad is None else param.grad + grad


class Linear(torch.nn.Module):
    """y = x W^T + b, TransformerEngine's arguments and parameter names.

    Args: in_features, out_features, bias, return_bias (return (y, bias) without adding it),
    params_dtype, device (default: the accelerator if present, else CPU), init_method
    (called on the weight; default normal(0, 0.023)), parameters_split (names, or
    {name: size}, splitting the output features into separately named parameters
    `<name>_weight` / `<name>_bias`), fuse_wgrad_accumulation (gradients go to
    weight.main_grad, .grad stays None), delay_wgrad_compute (backward computes only the
    input gradient; backward_dw() computes and accumulates the weight and bias gradients
    later, for pipeline schedules). Tensor parallelism (tp_size > 1) is not implemented yet
    and is refused.
    forward(inp, is_first_microbatch=None): inp [..., in_features]. Inside te.autocast the
    GEMMs run in FP8; is_first_microbatch=False reuses the weight cast on the last True call
    without updating the weight amax.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, device: Optional[Union[torch.device, str]] = None,
                 init_method: Optional[Callable[[Tensor], None]] = None, parallel_mode: Optional[str] = None,
                 tp_group: Optional[object] = None, tp_size: int = 1, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False,
                 parameters_split: Optional[Union[Sequence[str], dict]] = None, delay_wgrad_compute: bool = False):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear: in_features and out_features must be positive, got {in_features}, {out_features}")
        if tp_size != 1 or parallel_mode is not None:
            raise NotImplementedError(f"Linear: tensor parallelism (tp_size={tp_size}, parallel_mode={parallel_mode!r}) "
                                      "is not implemented yet")
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = delay_wgrad_compute
        self._deferred_wgrad: list = []
        self.sequence_parallel = sequence_parallel
        self.init_method = init_method or (lambda w: torch.nn.init.normal_(w, mean=0.0, std=0.023))
        factory = {"dtype": params_dtype or torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        self.parameter_names = self._split_names(parameters_split, out_features)
        for name, size in self.parameter_names:
            self.register_parameter(f"{name}weight", torch.nn.Parameter(torch.empty(size, in_features, **factory)))
            bias_param = torch.nn.Parameter(torch.empty(size, **factory)) if bias else None
            self.register_parameter(f"{name}bias", bias_param)  # None without bias, as torch.nn.Linear
        self.fp8_meta: Optional[Fp8Meta] = None
        self._weight_fp8: Optional[Fp8Operand] = None
        self.weight_quantization = weight_quantization_in_force()  # te.quantized_model_init
        if factory["device"].type != "meta":
            self.reset_parameters()

    @staticmethod
    def _split_names(parameters_split, out_features: int):
        """[(prefix, rows)]: ("", out_features) unsplit, else one entry per named part."""
        if parameters_split is None:
            return [("", out_features)]
        if isinstance(parameters_split, dict):
            sizes = dict(parameters_split)
        else:
            names = list(parameters_split)
            if out_features % len(names):
                raise ValueError(f"Linear: out_features={out_features} is not divisible by "
                                 f"{len(names)} parameters_split names {names}")
            sizes = {name: out_features // len(names) for name in names}
        if sum(sizes.values()) != out_features:
            raise ValueError(f"Linear: parameters_split sizes {sizes} do not add up to out_features={out_features}")
        return [(f"{name.rstrip('_')}_", size) for name, size in sizes.items()]

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for name, _ in self.parameter_names:
                weight = getattr(self, f"{name}weight")
                self.init_method(weight)  # an FP8 weight re-quantises what is written into it
                if self.weight_quantization is not None and not isinstance(weight, QuantizedTensor):
                    setattr(self, f"{name}weight", self.weight_quantization.quantized_parameter(weight))
                if self.use_bias:
                    getattr(self, f"{name}bias").zero_()

    def _weight_and_bias(self) -> Tuple[Tensor, Optional[Tensor]]:
        if len(self.parameter_names) == 1 and self.parameter_names[0][0] == "":
            return self.weight, self.bias if self.use_bias else None
        weight = torch.cat([getattr(self, f"{n}weight") for n, _ in self.parameter_names])
        bias = torch.cat([getattr(self, f"{n}bias") for n, _ in self.parameter_names]) if self.use_bias else None
        return weight, bias

    def _meta_for(self, recipe, device: torch.device) -> Fp8Meta:
        history_len = recipe.amax_history_len if recipe.delayed() else 1
        meta = self.fp8_meta
        if meta is None or meta.scaling_fwd.amax_history.shape[0] != history_len:
            meta = Fp8Meta(forward_slots=3, backward_slots=2, history_len=history_len, device=device)
            self.fp8_meta = meta
        meta.recipe = recipe
        return meta

    def forward(self, inp: Tensor, is_first_microbatch: Optional[bool] = None):
        if inp.shape[-1] != self.in_features:
            raise ValueError(f"Linear: input of shape {tuple(inp.shape)} does not end in in_features={self.in_features}")
        weight, bias = self._weight_and_bias()
        x = inp.reshape(-1, self.in_features)  # [..., in] -> [tokens, in]
        context = current_context()
        fp8 = None
        if context is not None and context.enabled:
            meta = self._meta_for(context.recipe, weight.device)
            reuse = is_first_microbatch is False and self._weight_fp8 is not None
            stored = (weight.fp8_operand_for(fp8_weight_layout(context.recipe))
                      if isinstance(weight, QuantizedTensor) else None)  # FP8 weights: no cast at all
            needs_backward = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
            fp8 = _Fp8Call(meta, self._weight_fp8 if reuse else stored, record_weight_amax=not reuse and stored is None,
                           needs_backward=needs_backward)
            defer_forward_update(meta.update_forward)
        elif context is not None and context.calibrating:
            meta = self._meta_for(context.recipe, weight.device)
            meta.record_amax(FORWARD, INPUT, x.detach().abs().amax().float())
            meta.record_amax(FORWARD, WEIGHT, weight.detach().abs().amax().float())
            defer_forward_update(meta.update_forward)
        main_grad = getattr(weight, "main_grad", None) if self.fuse_wgrad_accumulation else None
        if self.fuse_wgrad_accumulation and main_grad is None and weight.requires_grad and torch.is_grad_enabled():
            raise ValueError("Linear: fuse_wgrad_accumulation=True needs weight.main_grad (a tensor the weight "
                             "gradient is accumulated into) to be set before the forward")
        out_bias = None if self.return_bias else bias
        deferred = self._deferred_wgrad if self.delay_wgrad_compute else None
        y = _LinearFunction.apply(x, weight, out_bias, fp8, self.fuse_wgrad_accumulation, main_grad, deferred)
        if fp8 is not None and is_first_microbatch is not None:
            self._weight_fp8 = fp8.weight_fp8  # cached for the following microbatches
        y = y.reshape(*inp.shape[:-1], self.out_features)
        return (y, bias) if self.return_bias else y

    def backward_dw(self) -> None:
        """With delay_wgrad_compute=True: computes the weight (and bias) gradients that the
        backward passes since the last call deferred, oldest first, and accumulates them."""
        pending, self._deferred_wgrad[:] = list(self._deferred_wgrad), []
        for compute in pending:
            compute()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint saved without FP8 state (or by torch.nn.Linear) has no _extra_state:
        # load it as "no FP8 state" instead of reporting a missing key.
        state_dict.setdefault(prefix + "_extra_state", {})
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def get_extra_state(self) -> dict:
        return self.fp8_meta.extra_state() if self.fp8_meta is not None else {}

    def set_extra_state(self, state) -> None:
        """Accepts our own state, an empty one (checkpoint saved without FP8) or None."""
        if not state:
            return
        history_len = state["amax_history_fwd"].shape[0]
        device = next(self.parameters()).device
        if self.fp8_meta is None or self.fp8_meta.scaling_fwd.amax_history.shape[0] != history_len:
            self.fp8_meta = Fp8Meta(forward_slots=3, backward_slots=2, history_len=history_len, device=device)
        self.fp8_meta.load_extra_state(state)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}"
