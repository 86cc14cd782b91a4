"""te.ops.Quantize: under te.autocast, the input cast to FP8 in the forward (a QuantizedTensor
of the recipe's kind, which reads as its values anywhere else) and/or the gradient cast in the
backward; outside an enabled region, the identity. Delayed scaling keeps this op's own state
(fp8_meta: one forward slot, one backward slot), updated as a module's is."""
from typing import Optional

import torch
from torch import Tensor

from ...fp8.state import BACKWARD, FORWARD
from ...module._fp8_module import Fp8ModuleMixin
from ...module._recompute_replay import replays_fp8_forward
from ...quantization import QuantizerRole
from ...tensor.for_recipe import slot_quantizer
from ...tensor.quantizer import Quantizer
from ..op import BasicOperation


class _CastBoth(torch.autograd.Function):
    """x -> forward_quantizer(x) (or x); the gradient -> backward_quantizer(gradient) (or as is):
    a QuantizedTensor in both directions, which any op downstream reads as its values."""

    @staticmethod
    def forward(ctx, x: Tensor, forward_quantizer: Optional[Quantizer], backward_quantizer: Optional[Quantizer],
                after_backward) -> Tensor:
        ctx.backward_quantizer, ctx.after_backward = backward_quantizer, after_backward
        return forward_quantizer.quantize(x) if forward_quantizer is not None else x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.backward_quantizer is not None:
            grad = ctx.backward_quantizer.quantize(grad.contiguous())
            ctx.after_backward()
        return grad, None, None, None


class Quantize(BasicOperation, Fp8ModuleMixin):
    fp8_forward_slots = 1
    fp8_backward_slots = 1

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self.quantize_forward, self.quantize_backward = forward, backward
        self.fp8_meta = None

    def _quantizer_roles(self) -> dict:
        """One forward slot (the input) and one backward slot (the gradient)."""
        return {FORWARD: [QuantizerRole(tensor_type="input")], BACKWARD: [QuantizerRole(tensor_type="grad_output")]}

    @replays_fp8_forward
    def forward(self, x: Tensor) -> Tensor:
        context = self._fp8_context()
        if context is None or not context.enabled or not (self.quantize_forward or self.quantize_backward):
            return x
        meta = self._fp8_meta(context, x.device)
        self._record_fp8_forward(meta)
        recipe = context.recipe
        forward_quantizer = slot_quantizer(recipe, meta, FORWARD, 0, columnwise=False) if self.quantize_forward else None
        backward_quantizer = slot_quantizer(recipe, meta, BACKWARD, 0) if self.quantize_backward else None
        return _CastBoth.apply(x, forward_quantizer, backward_quantizer, lambda: meta.update(BACKWARD))
