"""The forward of every GEMM module, Linear, LayerNormLinear, LayerNormMLP and GroupedLinear, in
the same named steps:

    inp, x = self._gemm_input(owner, inp, ...)     checks, torch.autocast's dtype, x [tokens, in]
    context = self._fp8_context()                  the one read of the autocast state
    calls = self._fp8_calls(context, weights, ...) in FP8: one Fp8Call per row of self.gemms
    y = self._linear(gemm, x, weight, ...)         per GEMM: calibration, main_grad, the deferred
                                                   weight gradient, the split over ranks
    self._keep_weights_fp8(calls, ...)             the weights' FP8 operands for the next microbatch

A module's table `gemms` names its GEMMs (_fp8_call.ModuleGemm: the weight's name and its FP8
slots, in TransformerEngine's numbering); the calls, their weight caches and the calibration
follow its rows. GroupedLinear runs its groups in one autograd function of its own, and takes
every step but _linear.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .._autocast import autocast_input
from ..fp8.context import Fp8Context, defer_forward_update
from ..utils import check_module_input
from ._fp8_call import Fp8Call, ModuleGemm, check_save_original_input, gemm_fp8_call, gemm_quantizers
from ._fp8_module import Fp8ModuleMixin
from ._linear_function import plain_linear_applies, split_linear
from ._tensor_parallel import TensorParallelAttributes


class MissingMainGrad(ValueError, AttributeError):
    """fuse_wgrad_accumulation without the weight's main_grad: a bad setting (ValueError) that
    is a missing attribute (AttributeError, which TE raises, in its backward, and its tests
    expect, e.g. under FSDP2, whose gathered weights lack the sharded ones' main_grad)."""


class GemmModule(TensorParallelAttributes, Fp8ModuleMixin):
    """The forward steps of a module whose GEMMs are the rows of `gemms`. Subclasses set
    `gemms`, `fuse_wgrad_accumulation`, `delay_wgrad_compute` and `_deferred_wgrad`;
    `save_original_input` where they take it."""
    gemms: Tuple[ModuleGemm, ...]
    save_original_input = False
    # Per row of gemms: the weight's FP8 operand of the last forward with is_first_microbatch
    # given, which a forward with is_first_microbatch=False reuses (None: none kept).
    _weights_fp8: Optional[List] = None

    @staticmethod
    def _gemm_input(owner: str, inp: Tensor, features: int, features_name: str) -> Tuple[Tensor, Tensor]:
        """The first step of every GEMM module's forward: `inp` refused with the module's name
        unless a floating-point tensor ending in `features`, then in torch.autocast's dtype
        where one is open; returns (that input, its tokens x [tokens, features]: the input
        itself when already 2-D, as a reshape to its own shape would only add a view and its
        autograd node to every call)."""
        if not (isinstance(inp, Tensor) and inp.is_floating_point() and inp.dim() >= 1):
            check_module_input(owner, "inp", inp)  # raises, naming what is wrong
        if inp.shape[-1] != features:
            raise ValueError(f"{owner}: input of shape {tuple(inp.shape)} does not end in {features_name}={features}")
        if torch._C._is_any_autocast_enabled():  # one C call outside every region
            inp = autocast_input(inp)
        return inp, inp if inp.dim() == 2 else inp.reshape(-1, features)  # [..., features] -> [tokens, features]

    def _fp8_calls(self, context: Optional[Fp8Context], weights: Sequence[Tensor],
                   is_first_microbatch: Optional[bool], needs_backward: bool) -> Optional[Tuple[Fp8Call, ...]]:
        """Inside an enabled te.autocast, the FP8 call of each GEMM of this forward, in the order
        of `gemms` (`weights` in that order too), with the module's state and the forward
        recorded once (_record_fp8_forward); else None."""
        if context is None or not context.enabled:
            return None
        meta = self._fp8_meta(context, weights[0].device)
        self._record_fp8_forward(meta)
        owner = type(self).__name__
        check_save_original_input(owner, self.save_original_input, context.recipe)
        cached = self._weights_fp8 or [None] * len(self.gemms)
        return tuple(gemm_fp8_call(context.recipe, meta, gemm, owner, weight, kept, is_first_microbatch, needs_backward,
                                   save_original_input=self.save_original_input,
                                   amax_reduction_group=context.amax_reduction_group)
                     for gemm, weight, kept in zip(self.gemms, weights, cached))

    def _keep_weights_fp8(self, calls: Optional[Sequence[Fp8Call]], is_first_microbatch: Optional[bool]) -> None:
        """The last step of an FP8 forward with is_first_microbatch given: its weights' FP8
        operands, for the following microbatches."""
        if calls is not None and is_first_microbatch is not None:
            self._weights_fp8 = [call.weight_fp8 for call in calls]

    def _linear(self, gemm: ModuleGemm, x: Tensor, weight: Tensor, bias: Optional[Tensor], fp8: Optional[Fp8Call],
                context: Optional[Fp8Context], parallel_mode: Optional[str], row_bias_after_sum: bool = True) -> Tensor:
        """One GEMM of the module, x [tokens, in] -> [tokens, out] (bias None: not added), by
        LinearFunction: calibrating contexts record the amaxes of x and the weight; the weight
        gradient goes to weight.main_grad under fuse_wgrad_accumulation and waits for
        backward_dw() under delay_wgrad_compute; the GEMM splits over the ranks of
        parallel_mode (split_linear)."""
        self._calibrate(context, gemm, x, weight)
        main_grad = self._main_grad(weight, gemm.weight_name)
        deferred = self._deferred_wgrad if self.delay_wgrad_compute else None
        return split_linear(x, weight, bias, fp8, self.fuse_wgrad_accumulation, main_grad, deferred,
                            self._gemm_split(parallel_mode), row_bias_after_sum)

    def _calibrate(self, context: Optional[Fp8Context], gemm: ModuleGemm, x: Tensor, weight: Tensor) -> None:
        """te.autocast(calibrating=True) around a high-precision GEMM of x and weight: their
        quantizers observe them (delayed scaling records their amaxes), so that the scales are
        ready when FP8 is switched on; the forward update is scheduled as for an FP8 forward.
        An empty x has no amax to record. Nothing outside a calibrating region."""
        if context is None or context.enabled or not context.calibrating:
            return
        meta = self._meta_for(context.recipe, weight.device)
        quantizers = gemm_quantizers(context.recipe, meta, needs_backward=False, gemm=gemm)
        if x.shape[0]:
            quantizers.input.calibrate(x)
        quantizers.weight.calibrate(weight)
        defer_forward_update(meta)

    def _plain_gemm(self, fp8: Optional[Fp8Call], context: Optional[Fp8Context], x: Tensor, weight: Tensor,
                    bias: Optional[Tensor], parallel_mode: Optional[str]) -> bool:
        """Whether this forward's GEMM of x, weight and bias may run as torch.nn.functional.linear
        under torch's autograd, skipping LinearFunction and the steps around it (same bits,
        less per-call cost): outside FP8 (fp8 None) and calibration, not split over ranks
        (parallel_mode None or one rank), without main_grad or a deferred weight gradient,
        and where plain_linear_applies."""
        return (fp8 is None and (context is None or not context.calibrating)
                and (parallel_mode is None or self.tp_size == 1)
                and not self.fuse_wgrad_accumulation and not self.delay_wgrad_compute
                and plain_linear_applies(x, weight, bias))

    def _main_grad(self, weight: Tensor, name: str) -> Optional[Tensor]:
        """The tensor `weight`'s gradient is accumulated into under fuse_wgrad_accumulation
        (weight.main_grad, set by the trainer before the forward; None without the option, or
        without a gradient to take), refused with the weight's name when it is missing."""
        if not self.fuse_wgrad_accumulation:
            return None
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is None and weight.requires_grad and torch.is_grad_enabled():
            raise MissingMainGrad(f"{type(self).__name__}: fuse_wgrad_accumulation=True needs {name}.main_grad (a "
                                  "tensor the weight gradient is accumulated into) to be set before the forward "
                                  "(FSDP2's gathered weights have none: the option does not work under it, as in TE)")
        return main_grad
