"""The FP8 call of a GEMM: what one FP8 GEMM forward needs besides its tensors, and how a
module makes it from the forward's recipe and its FP8 state.

ModuleGemm is one row of a module's table of GEMMs: its weight's name and its slots in the
module's fp8_meta. GemmQuantizers are the quantizers of the GEMM's operands over those slots
(TE's quantizer objects, tensor/for_recipe.py); Fp8Call is the immutable value a module hands
its GEMM (LinearFunction, _linear_function.py; GroupedLinear's; te.ops'); gemm_fp8_call makes
one, with the weight's FP8 operand (weight_operand: a microbatch cache, an FP8 parameter's
stored codes, or the weight cast here).
"""
import dataclasses
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ...common.recipe import Recipe
from ..fp8.codes import Float8Codes
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta, Fp8Operand, feeds_backward
from ..tensor.for_recipe import slot_quantizer, weight_layout
from ..tensor.quantizer import Quantizer


class ModuleGemm(NamedTuple):
    """One GEMM of a module, as TransformerEngine numbers its FP8 slots: the weight's parameter
    name (in messages: main_grad, a stored FP8 weight the recipe cannot use), the forward slots
    of the input and the weight, the backward slot of the output's gradient, and whether its
    backward runs the module's backward scaling update (the module's last GEMM in backward
    order, so that the history rolls once per step)."""
    weight_name: str
    input_slot: int
    weight_slot: int
    grad_output_slot: int
    updates_backward: bool


# The GEMM of a module with one: Linear's, LayerNormLinear's.
ONE_GEMM = (ModuleGemm("weight", input_slot=0, weight_slot=1, grad_output_slot=0, updates_backward=True),)


class GemmQuantizers(NamedTuple):
    """The quantizers of one GEMM's FP8 operands: input and weight cast in the forward (their
    column-wise usage set when the backward GEMMs will read the transposed layouts), the
    output's gradient in the backward (None where no backward is due); and of the results handed
    on in FP8 (None: in high precision): the output (fp8_output) and the input's gradient
    (fp8_grad), see _output_forms.py."""
    input: Quantizer
    weight: Quantizer
    grad_output: Optional[Quantizer]
    output: Optional[Quantizer] = None
    grad_input: Optional[Quantizer] = None


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: compared by identity, never by its tensors
class Fp8Call:
    """What one FP8 GEMM forward needs besides tensors (made by the module, read here; a value:
    a producer that casts the input returns a new call, dataclasses.replace(call, input_fp8=...)).

    recipe: the recipe of the forward's autocast context. quantizers: the GEMM's
    GemmQuantizers. weight_fp8: the weight's FP8 operand for this GEMM (a microbatch cache, an
    FP8 parameter's stored codes, or cast by the module before the call: see
    gemm_fp8_call). needs_backward: decided outside (autograd.Function.forward runs
    without grad). update_after_backward: the FP8 state whose backward slots get the
    delayed-scaling update after this GEMM's backward (only the module's last GEMM in backward
    order names it, so that the history rolls once per step), else None.
    save_original_input: keep the high-precision input for the weight gradient and cast it
    again in the backward (TE's memory trade when the input is kept anyway, e.g. attention's
    output); the same codes as the forward's for every recipe that scales from the tensor
    itself, so refused for DelayedScaling by the modules. input_fp8: the input already cast by
    a fused producer (norm or activation -> FP8 kernel; see _fused_fp8.py), else None: the
    input is cast here. amax_reduction_group: the forward autocast's, over which the backward
    update reduces the backward amaxes too (None: the default group). te.GroupedLinear passes
    one call per group.
    """
    recipe: Recipe
    quantizers: GemmQuantizers
    weight_fp8: Fp8Operand
    needs_backward: bool
    update_after_backward: Optional[Fp8Meta] = None
    save_original_input: bool = False
    input_fp8: Optional[Fp8Operand] = None
    amax_reduction_group: Optional[object] = None


def check_save_original_input(owner: str, save_original_input: bool, recipe: Recipe) -> None:
    """save_original_input casts the kept input again in the backward: with DelayedScaling the
    input's scale has been updated since the forward, so the codes would differ. Refused."""
    if save_original_input and recipe.delayed():
        raise ValueError(f"{owner}: save_original_input=True does not work with the DelayedScaling recipe (the "
                         "backward would cast the input with a scale updated since the forward)")


def gemm_quantizers(recipe: Recipe, meta: Fp8Meta, needs_backward: bool, gemm: ModuleGemm,
                    save_original_input: bool = False) -> GemmQuantizers:
    """The quantizers of one GEMM's operands under `recipe` over the module's slots. The forward
    casts also make the transposed layouts the backward GEMMs read when a backward in FP8 is
    due (not under a recipe's backward_override, which runs it in high precision; nor the
    input's with save_original_input, which the backward casts again). Without a backward due
    (inference, decoding) there is no gradient's quantizer to make."""
    transposes = needs_backward and recipe.backward_override is None
    return GemmQuantizers(
        input=slot_quantizer(recipe, meta, FORWARD, gemm.input_slot, "input",
                             columnwise=transposes and not save_original_input),
        weight=slot_quantizer(recipe, meta, FORWARD, gemm.weight_slot, "weight", columnwise=transposes),
        grad_output=slot_quantizer(recipe, meta, BACKWARD, gemm.grad_output_slot) if needs_backward else None)


def gemm_fp8_call(recipe: Recipe, meta: Fp8Meta, gemm: ModuleGemm, owner: str, weight: Tensor,
                  cached: Optional[Fp8Operand], is_first_microbatch: Optional[bool], needs_backward: bool,
                  save_original_input: bool = False, amax_reduction_group: Optional[object] = None) -> Fp8Call:
    """The Fp8Call of the module `owner`'s GEMM `gemm` under `recipe`, with its weight operand:
    an FP8 parameter's stored codes when their layout suits the recipe (no cast at all); with
    is_first_microbatch=False, the operand `cached` from the last call (no cast, its amax not
    recorded again); else the weight cast here, its amax recorded in its slot. The GEMM's
    backward reduces the amaxes it updates over amax_reduction_group (the forward autocast's)."""
    quantizers = gemm_quantizers(recipe, meta, needs_backward, gemm, save_original_input)
    # A cache cast without a backward (a forward under no_grad, as a reentrant checkpoint runs
    # it first) cannot serve one: cast again.
    reuse = is_first_microbatch is False and cached is not None and (not needs_backward or feeds_backward(cached))
    weight_fp8 = weight_operand(recipe, quantizers.weight, weight, cached if reuse else None, needs_backward,
                                f"{owner}'s {gemm.weight_name}")
    if is_first_microbatch is not None and isinstance(weight_fp8, Float8Codes):
        weight_fp8.keep_packed()  # the cached weight meets every microbatch's GEMM: the CPU packs it once
    return Fp8Call(recipe, quantizers, weight_fp8, needs_backward=needs_backward,
                   update_after_backward=meta if gemm.updates_backward else None,
                   save_original_input=save_original_input,
                   amax_reduction_group=amax_reduction_group)


def weight_operand(recipe: Recipe, quantizer: Quantizer, weight: Tensor, reused: Optional[Fp8Operand],
                   needs_backward: bool, owner: str) -> Fp8Operand:
    """One weight's FP8 operand for this forward: `reused` (the last call's, when the caller
    may reuse it), else an FP8 parameter's stored codes when their layout suits the recipe (no
    cast at all; `owner` names the weight if the recipe cannot use them; under a CustomRecipe, when
    they are in `quantizer`'s layout), else the weight cast
    here by `quantizer` (outside autograd: its gradient comes from the GEMM's own backward). An
    operand kept for inference only (no column-wise copy) cannot serve a backward: the weight
    is then cast from its values."""
    operand = reused
    if operand is None and isinstance(weight, QuantizedTensor):
        # A CustomRecipe's weight layout is its factory's answer for this slot: `quantizer`'s.
        operand = (weight.fp8_operand_for(quantizer.layout) if recipe.custom()
                   else weight.operand_for_recipe(recipe, weight_layout(recipe), owner))
    if operand is not None and (not needs_backward or feeds_backward(operand)):
        return operand
    with torch.no_grad():
        return quantizer.operand_of(weight)
