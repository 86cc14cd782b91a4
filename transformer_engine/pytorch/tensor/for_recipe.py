"""The quantizers of a recipe: the one it casts a module's stored weights with
(te.quantized_model_init), and the one of each FP8 slot of a module's state, which is how
the modules cast every GEMM operand (and what module.quantizers shows TE code)."""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from ...common.recipe import Recipe
from ..custom_ops.fp8_cast import fp8_quantize_delayed_
from ..fp8.codes import Float8Codes
from ..fp8.model_init import WeightQuantization
from ..fp8.replay import note_use
from ..fp8.state import BACKWARD, FORWARD, WEIGHT_SLOT, CustomAnswers, Fp8Meta
from ..dtensor import is_dtensor, like_dtensor, local_tensor, shard_group
from .float8_blockwise_tensor import Float8BlockQuantizer
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, per_tensor_layout
from .mxfp8_tensor import MXFP8Quantizer
from .nvfp4_tensor import NVFP4Quantizer
from .quantizer import Quantizer
from .requests import DelayedScalingRequest

ROLES = ("input", "weight", "grad")


def weight_quantizer(recipe: Recipe) -> Quantizer:
    """Per-tensor recipes: the weight's own amax sets its scale, re-derived on every write
    (also under DelayedScaling: a stored weight has no history to delay by). Block recipes:
    the recipe's weight blocks, both usages (the backward's dgrad GEMM reads the column-wise
    copy)."""
    fp8_dtype = recipe.fp8_format.dtype(backward=False)
    if recipe.float8_per_tensor_scaling():
        return Float8CurrentScalingQuantizer(fp8_dtype, columnwise=True)
    if recipe.mxfp8() or recipe.float8_block_scaling():
        return block_quantizer(recipe, "weight")
    if recipe.nvfp4():
        return nvfp4_quantizer(recipe, "weight")
    raise NotImplementedError(f"weight_quantizer: no FP8 weight storage for {type(recipe).__name__}")


def weight_layout(recipe: Recipe):
    """A key naming how `recipe` casts weights: a stored FP8 weight with the same key is fed
    to the GEMMs as it is; any other recipe casts the dequantised weight afresh. (Read on
    every forward of a module with FP8 weights: the per-tensor key is made without building
    a quantizer, which allocates its scale and amax.)"""
    if recipe.float8_per_tensor_scaling():
        return per_tensor_layout(recipe.fp8_format.dtype(backward=False))
    return weight_quantizer(recipe).layout


def quantized_weight(quantization: WeightQuantization, values: Tensor,
                     quantizer: Optional[Quantizer] = None) -> torch.nn.Parameter:
    """A Parameter holding `values` (a 2-D weight) in FP8 as te.quantized_model_init asked
    (`quantization`): a Float8Tensor, Float8BlockwiseQTensor or MXFP8Tensor, per the recipe
    (quantizer: the module's own for the weight, see Fp8ModuleMixin.stored_weight). A DTensor
    (a module sharded by FSDP2 before reset_parameters) becomes a DTensor of the same layout
    over its shard cast, the shards' casts sharing the whole weight's scale (tensor/fsdp2.py);
    preserve_high_precision_init_val then keeps the shard's values."""
    quantizer = quantizer or weight_quantizer(quantization.recipe)
    quantizer.set_usage(columnwise=quantization.for_training)
    shard = local_tensor(values).detach()
    group = shard_group(values) if is_dtensor(values) else None
    if group is not None:
        quantizer.share_scale_over(group)
    weight = quantizer.quantize(shard)
    if quantization.preserve_high_precision_init_val:
        weight._storage.high_precision_init_val = shard.cpu().clone()
    return torch.nn.Parameter(like_dtensor(weight, values), requires_grad=values.requires_grad)


def slot_quantizer(recipe: Recipe, meta: Fp8Meta, direction: str, slot: int, role: Optional[str] = None,
                   columnwise: bool = True) -> Quantizer:
    """The quantizer of one slot of a module's FP8 state `meta` under `recipe` (the forward's,
    from its autocast context). Forward slots come as (input, weight, output) per GEMM unless
    `role` ('input' or 'weight') says otherwise; backward slots hold gradients. The per-tensor
    quantizers read and write the slot itself (SlotQuantizer); the block ones keep nothing; a
    CustomRecipe's are its factory's answers, kept in meta.custom. columnwise: whether a cast
    also makes the layout the backward GEMMs read (TE's usage)."""
    if recipe.custom():
        return with_columnwise(meta.custom.quantizers[direction][slot], columnwise)
    backward = direction == BACKWARD
    fp8_dtype = recipe.fp8_format.dtype(backward=backward)
    if recipe.delayed():
        return DelayedSlotQuantizer(meta, direction, slot, fp8_dtype, columnwise=columnwise)
    if recipe.float8_current_scaling():
        return CurrentSlotQuantizer(meta, direction, slot, fp8_dtype, force_pow_2_scales=recipe.use_power_2_scales,
                                    amax_epsilon=recipe.amax_epsilon, columnwise=columnwise)
    if recipe.mxfp8() or recipe.float8_block_scaling() or recipe.nvfp4():
        role = "grad" if backward else role or ("weight" if slot % 3 == WEIGHT_SLOT else "input")
        if recipe.nvfp4():
            return nvfp4_quantizer(recipe, role, columnwise)
        return block_quantizer(recipe, role, columnwise)
    raise NotImplementedError(f"slot_quantizer: no quantizer for {type(recipe).__name__}")


def factory_quantizers(recipe: Recipe, roles: Dict[str, list]) -> Dict[str, list]:
    """A CustomRecipe's answer for each slot: recipe.qfactory(role) for each role of
    roles[FORWARD] and roles[BACKWARD] (a QuantizerRole, or None where the consumer is unknown),
    called once here. Each answer is one of this package's quantizers, whose casts the GEMMs
    consume, or a DelayedScalingRequest (custom_answers makes its quantizer); all the requests
    must be equal."""
    made = {direction: [recipe.qfactory(role) for role in roles[direction]] for direction in (FORWARD, BACKWARD)}
    for direction, answers in made.items():
        for role, answer in zip(roles[direction], answers):
            if isinstance(answer, DelayedScalingRequest):
                continue
            if not isinstance(answer, Quantizer) or type(answer).operand_of is Quantizer.operand_of:
                raise NotImplementedError(
                    f"CustomRecipe: qfactory({role}) returned {type(answer).__name__}; this package's GEMMs take "
                    "Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer, "
                    "NVFP4Quantizer or a DelayedScalingRequest")
    requests = _requests(made)
    if any(request != requests[0] for request in requests):
        raise ValueError(f"CustomRecipe: the DelayedScalingRequests of one module must be equal (they share its "
                         f"scaling update), got {sorted(set(map(repr, requests)))}")
    return made


def custom_answers(recipe: Recipe, made: Dict[str, list], meta: Fp8Meta) -> CustomAnswers:
    """factory_quantizers' answers as the module keeps them: each DelayedScalingRequest
    replaced by the quantizer of its slot of `meta` (the request's format: E4M3 forward, E5M2
    backward under HYBRID), and the DelayedScaling the requests make (None without)."""
    quantizers = {direction: [DelayedSlotQuantizer(meta, direction, slot,
                                                   answer.fp8_format.dtype(backward=direction == BACKWARD))
                              if isinstance(answer, DelayedScalingRequest) else answer
                              for slot, answer in enumerate(answers)]
                  for direction, answers in made.items()}
    return CustomAnswers(recipe, quantizers, requested_delayed_scaling(made))


def requested_delayed_scaling(made: Dict[str, list]) -> Optional[Recipe]:
    """The DelayedScaling recipe the requested slots are updated with, None without requests."""
    requests = _requests(made)
    return requests[0].as_recipe() if requests else None


def _requests(made: Dict[str, list]) -> List[DelayedScalingRequest]:
    return [answer for answers in made.values() for answer in answers if isinstance(answer, DelayedScalingRequest)]


def with_columnwise(quantizer: Quantizer, columnwise: bool) -> Quantizer:
    """The quantizer with the column-wise usage asked for: itself, or a copy (sharing its
    state tensors) set to it."""
    if quantizer.columnwise_usage == columnwise:
        return quantizer
    copy = quantizer.copy()
    copy.set_usage(columnwise=columnwise)
    return copy


def block_quantizer(recipe: Recipe, role: str, columnwise: bool = True) -> Quantizer:
    """The quantizer a block recipe casts operands of `role` ('input', 'weight' or 'grad')
    with: MXFP8's 1 x 32 blocks (E8M0 scales; 32 x 32 for weights under the recipe's
    enable_2d_quantization); Float8BlockScaling's 1 x 128 or 128 x 128 per
    its x/w/grad_block_scaling_dim, power-of-two scales unless use_power_2_scales=False."""
    if role not in ROLES:
        raise ValueError(f"block_quantizer: role must be one of {ROLES}, got {role!r}")
    fp8_dtype = recipe.fp8_format.dtype(backward=role == "grad")
    if recipe.mxfp8():
        return MXFP8Quantizer(fp8_dtype, columnwise=columnwise,
                              with_2d_quantization=role == "weight" and recipe.enable_2d_quantization)
    if not recipe.float8_block_scaling():
        raise ValueError(f"block_quantizer: {type(recipe).__name__} is not a block-scaling recipe")
    dim = {"input": recipe.x_block_scaling_dim, "weight": recipe.w_block_scaling_dim,
           "grad": recipe.grad_block_scaling_dim}[role]
    return Float8BlockQuantizer(fp8_dtype, columnwise=columnwise, block_scaling_dim=dim,
                                force_pow_2_scales=recipe.use_power_2_scales, amax_epsilon=recipe.amax_epsilon)


def nvfp4_quantizer(recipe: Recipe, role: str, columnwise: bool = True) -> NVFP4Quantizer:
    """NVFP4BlockScaling's quantizer for `role` ('input': the forward's activations, 'weight' or
    'grad'), from the recipe's fp4_quant_fwd_inp / fp4_quant_fwd_weight / fp4_quant_bwd_grad:
    the random Hadamard transform (with its own amax) on the column-wise usage that the
    weight-gradient GEMM reads, stochastic rounding, 16 x 16 weight tiles; and, for the forward's
    casts the recipe names, one amax per row (row_scaled_activation) and 4over6."""
    if role not in ROLES:
        raise ValueError(f"nvfp4_quantizer: role must be one of {ROLES}, got {role!r}")
    params = {"input": recipe.fp4_quant_fwd_inp, "weight": recipe.fp4_quant_fwd_weight,
              "grad": recipe.fp4_quant_bwd_grad}[role]
    four_over_six = _nvfp4_scope_includes(recipe.nvfp4_4over6, role)
    if four_over_six and (params.random_hadamard_transform or params.stochastic_rounding):
        asked = "the random Hadamard transform" if params.random_hadamard_transform else "stochastic rounding"
        raise ValueError(f"NVFP4BlockScaling: 4over6 casts the {role} operands, whose QParams ask for {asked}; "
                         "4over6 takes neither (set the operand's QParams without it)")
    e4m3_max = 256 if four_over_six and _nvfp4_scope_includes(recipe.nvfp4_4over6_e4m3_use_256, role) else 448
    return NVFP4Quantizer(columnwise=columnwise, with_rht=params.random_hadamard_transform,
                          with_post_rht_amax=params.random_hadamard_transform,
                          with_2d_quantization=params.fp4_2d_quantization,
                          stochastic_rounding=params.stochastic_rounding,
                          row_scaled_nvfp4=role == "input" and recipe.row_scaled_activation,
                          nvfp4_use_4over6=four_over_six, nvfp4_e4m3_max=e4m3_max,
                          nvfp4_4over6_err_mode=recipe.nvfp4_4over6_err_mode)


def _nvfp4_scope_includes(scope: str, role: str) -> bool:
    """Whether a 4over6 scope of NVFP4BlockScaling ('none', 'weights', 'activations', 'all')
    covers the casts of `role` (gradients never)."""
    if role == "grad":
        return False
    return scope == "all" or scope == {"weight": "weights", "input": "activations"}[role]


class SlotQuantizer:
    """A per-tensor quantizer whose scale and amax are one slot of a module's FP8 state
    (meta[direction], slot): read and written there at each use, so a replaced or reloaded
    state (set_extra_state, te.checkpoint's replay, TE code assigning fp8_meta[...]) is what
    the next cast sees. TE's `scale` and `amax` attributes are views of the slot. Every read
    and write names the state to fp8/replay.py first (note_use), so that a recompute's replay
    has put the original forward's scales in place before a cast reads them."""
    meta: Fp8Meta
    direction: str
    slot: int

    def _bind(self, meta: Fp8Meta, direction: str, slot: int) -> None:
        self.meta, self.direction, self.slot = meta, direction, slot

    @property
    def scale(self) -> Tensor:
        note_use(self.meta)
        return self.meta.slot_scale(self.direction, self.slot)  # [1] fp32

    @property
    def amax(self) -> Tensor:
        return self.meta[self.direction].amax_history[0, self.slot:self.slot + 1]  # the live row, [1] fp32

    def copy(self) -> Quantizer:
        return type(self)(self.meta, self.direction, self.slot, self.fp8_dtype, rowwise=self.rowwise_usage,
                          columnwise=self.columnwise_usage)


class DelayedSlotQuantizer(SlotQuantizer, Float8Quantizer):
    """DelayedScaling's quantizer of a slot: casts with the slot's scale (set by the recipe's
    update) and records the amax of what it casts into the slot (Fp8Meta.record_amax: a
    running maximum in the live row, the slot marked as cast this step)."""

    def __init__(self, meta: Fp8Meta, direction: str, slot: int, fp8_dtype: torch.dtype, *, rowwise: bool = True,
                 columnwise: bool = True) -> None:
        Quantizer.__init__(self, rowwise=rowwise, columnwise=columnwise)
        self.fp8_dtype = fp8_dtype
        self._bind(meta, direction, slot)

    def operand_of(self, x: Tensor) -> Float8Codes:
        """The row-wise codes of x at the slot's scale, recorded in the slot, in one op (the
        per-call cost of a decoding step); a 2-D x whose transpose is wanted too (training), or
        a traced cast, through Float8Quantizer's steps: the same codes and record."""
        if (self.columnwise_usage and x.dim() == 2) or torch.compiler.is_compiling():
            return super().operand_of(x)
        note_use(self.meta)
        state = self.meta[self.direction]._buffers  # one lookup per tensor, not nn.Module's __getattr__
        data, scale_inv = fp8_quantize_delayed_(x, state["scale"], self.slot, state["amax_history"],
                                                state["amax_recorded"], self.fp8_dtype)
        return Float8Codes(data, scale_inv)

    def record_amax(self, amax: Tensor) -> None:
        note_use(self.meta)
        self.meta.record_amax(self.direction, self.slot, amax)


class CurrentSlotQuantizer(SlotQuantizer, Float8CurrentScalingQuantizer):
    """Float8CurrentScaling's quantizer of a slot: the scale comes from the tensor's own amax
    (the recipe's amax_epsilon and power-of-two option), and the slot keeps the last cast's
    amax, scale and scale_inv for inspection and checkpoints."""

    def __init__(self, meta: Fp8Meta, direction: str, slot: int, fp8_dtype: torch.dtype, *,
                 force_pow_2_scales: bool, amax_epsilon: float, rowwise: bool = True, columnwise: bool = True) -> None:
        Quantizer.__init__(self, rowwise=rowwise, columnwise=columnwise)
        self.fp8_dtype = fp8_dtype
        self.force_pow_2_scales, self.amax_epsilon = force_pow_2_scales, float(amax_epsilon)
        self.use_existing_amax, self.with_amax_reduction, self.amax_reduction_group = False, False, None
        self._bind(meta, direction, slot)

    def copy(self) -> Quantizer:
        clone = CurrentSlotQuantizer(self.meta, self.direction, self.slot, self.fp8_dtype,
                                     force_pow_2_scales=self.force_pow_2_scales, amax_epsilon=self.amax_epsilon,
                                     rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        clone.with_amax_reduction, clone.amax_reduction_group = self.with_amax_reduction, self.amax_reduction_group
        return clone

    def _keep(self, amax: Tensor, scale: Tensor, scale_inv: Tensor) -> None:
        note_use(self.meta)
        self.meta.keep_current_scale(self.direction, self.slot, amax, scale, scale_inv)
