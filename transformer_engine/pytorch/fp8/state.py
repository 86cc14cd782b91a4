"""Per-module FP8 state (TransformerEngine's fp8_meta): what the per-tensor quantizers of its
slots (tensor/for_recipe.py) cast with and record into, and the delayed-scaling update.

module.fp8_meta["scaling_fwd"] and ["scaling_bwd"] each hold, for their slots (a Linear:
forward 0 input, 1 weight, 2 output; backward 0 grad_output, 1 grad_input):
    amax_history [amax_history_len, slots] fp32, row 0 live, zeros at start
    scale [slots] fp32, ones at start;  scale_inv [slots] = 1 / scale
They are non-persistent buffers (they follow .to(device)); checkpoints carry them through the
owning module's _extra_state (see extra_state()).
"""
from typing import Optional, Union

import torch
from torch import Tensor

from ...common import recipe as recipes
from .block_tensor import Float8BlockPair
from .codes import Float8Codes
from .context import note_fp8_state_use, reduce_amax
from .scaling import update_delayed_scaling

FORWARD, BACKWARD = "scaling_fwd", "scaling_bwd"
Fp8Operand = Union[Float8Codes, Float8BlockPair]  # what a quantizer's operand_of() gives a GEMM
WEIGHT_SLOT = 1  # forward slots come in (input, weight, output) triples, one per GEMM


def feeds_backward(operand: Fp8Operand) -> bool:
    """Whether a cast operand can also feed the backward GEMMs: per-tensor codes transpose on
    demand; block-scaled ones need the column-wise copy, made only when a backward was due."""
    return not isinstance(operand, Float8BlockPair) or operand.columnwise is not None


class ScalingGroup(torch.nn.Module):
    """amax_history, scale and scale_inv of one direction's slots, and which slots recorded an
    amax since the last update (only those roll and rescale, as in TE: a slot never cast, such
    as a Linear's output, or a weight reused from the first microbatch, keeps its state).
    transformer_engine_torch.FP8TensorMeta is this class (empty when built without arguments)."""

    def __init__(self, slots: int = 0, history_len: int = 1, device: Optional[torch.device] = None):
        super().__init__()
        fp32 = {"dtype": torch.float32, "device": device}  # whatever torch.get_default_dtype() is
        self.register_buffer("amax_history", torch.zeros(history_len, slots, **fp32), persistent=False)
        self.register_buffer("scale", torch.ones(slots, **fp32), persistent=False)
        self.register_buffer("scale_inv", torch.ones(slots, **fp32), persistent=False)
        self.register_buffer("amax_recorded", torch.zeros(slots, dtype=torch.bool, device=device), persistent=False)

    def _apply(self, fn, recurse=True):
        """Device moves apply; dtype casts do not: the scaling state stays fp32 whatever the
        model is cast to (model.to(torch.bfloat16), .half()), as TE keeps it."""
        return super()._apply(lambda t: t.to(fn(t[:0]).device), recurse)


class Fp8Meta(torch.nn.Module):
    """fp8_meta["scaling_fwd"] / ["scaling_bwd"], the recipe they were last used with, and a
    CustomRecipe's quantizers."""

    def __init__(self, forward_slots: int, backward_slots: int, history_len: int, device: torch.device):
        super().__init__()
        self.scaling_fwd = ScalingGroup(forward_slots, history_len, device)
        self.scaling_bwd = ScalingGroup(backward_slots, history_len, device)
        self.recipe: Optional[recipes.Recipe] = None
        # The delayed-scaling parameters update() follows: the recipe when it is DelayedScaling,
        # a CustomRecipe's DelayedScalingRequest made into one; None: nothing to update.
        self.delayed_scaling: Optional[recipes.DelayedScaling] = None
        # Under a CustomRecipe: {FORWARD: [...], BACKWARD: [...]}, the quantizer its factory
        # made for each slot (tensor/for_recipe.py's factory_quantizers), kept across steps.
        self.custom_quantizers: Optional[dict] = None

    def __getitem__(self, key: str) -> ScalingGroup:
        if key not in (FORWARD, BACKWARD):
            raise KeyError(f"fp8_meta has '{FORWARD}' and '{BACKWARD}', not {key!r}")
        return getattr(self, key)

    def __setitem__(self, key: str, group: ScalingGroup) -> None:
        """Replaces one direction's state (TE code assigns a tex.FP8TensorMeta)."""
        if key not in (FORWARD, BACKWARD):
            raise KeyError(f"fp8_meta has '{FORWARD}' and '{BACKWARD}', not {key!r}")
        if not isinstance(group, ScalingGroup):
            raise TypeError(f"fp8_meta[{key!r}] must be a ScalingGroup (tex.FP8TensorMeta), got {type(group).__name__}")
        setattr(self, key, group)

    def record_amax(self, direction: str, slot: int, amax: Tensor) -> None:
        """Max-accumulates an amax into the live row (a NaN sticks, and the update then keeps
        the previous scale) and marks the slot as cast this step."""
        note_fp8_state_use(self)
        scaling = self[direction]
        live = scaling.amax_history[0, slot]
        live.copy_(torch.maximum(live, amax.to(live.dtype).reshape(live.shape)))
        scaling.amax_recorded[slot] = True

    def slot_scale(self, direction: str, slot: int) -> Tensor:
        """The scale a cast of this slot uses, [1] fp32 (a view: the slot's own); noted as a
        use first, like every read and write, so that a te.checkpoint replay has put the
        original forward's scales in place before the cast reads them."""
        note_fp8_state_use(self)
        return self[direction].scale[slot:slot + 1]

    def keep_current_scale(self, direction: str, slot: int, amax: Tensor, scale: Tensor) -> None:
        """Current scaling: the slot keeps the last cast's amax [1] and scale [1] (and 1 / scale),
        for inspection and checkpoints; nothing is computed from them."""
        note_fp8_state_use(self)
        scaling = self[direction]
        scaling.scale[slot:slot + 1].copy_(scale)
        scaling.scale_inv[slot:slot + 1].copy_(torch.reciprocal(scale))
        scaling.amax_history[0, slot:slot + 1].copy_(amax)

    def update(self, direction: str, group: Optional[object] = None) -> None:
        """Delayed-scaling update of one direction (no-op for recipes that scale from the
        current tensor): reduce the live amaxes over `group`, then the pure update."""
        rec = self.delayed_scaling
        if rec is None:
            return
        scaling = self[direction]
        # A slot took part in this step if it recorded an amax through record_amax, or if
        # anything else (a quantizer viewing the slot, TE code) wrote a live amax.
        recorded = scaling.amax_recorded | (scaling.amax_history[0] != 0)
        if rec.reduce_amax:
            reduce_amax(scaling.amax_history[0], group)
            recorded = recorded.float()  # a slot any rank recorded updates on every rank
            reduce_amax(recorded, group)
            recorded = recorded > 0
        limits = rec.fp8_format.value
        fp8_max = limits.max_fwd if direction == FORWARD else limits.max_bwd
        history, scale = update_delayed_scaling(scaling.amax_history, scaling.scale, fp8_max, rec)
        scale = torch.where(recorded, scale, scaling.scale)
        scaling.amax_history.copy_(torch.where(recorded, history, scaling.amax_history))
        scaling.scale.copy_(scale)
        scaling.scale_inv.copy_(torch.reciprocal(scale))
        scaling.amax_recorded.zero_()

    def update_forward(self, group: Optional[object]) -> None:
        self.update(FORWARD, group)

    def forward_state(self, with_history: bool = True) -> dict:
        """Copies of the forward scale, scale_inv and (with_history) amax_history: te.checkpoint
        recomputes a forward with the scales it used, then puts the whole state back."""
        group = self.scaling_fwd
        names = ("scale", "scale_inv") + (("amax_history", "amax_recorded") if with_history else ())
        return {name: getattr(group, name).clone() for name in names}

    def load_forward_state(self, state: dict) -> None:
        """Writes forward_state()'s copies back, in place (the buffers keep their identity)."""
        for name, value in state.items():
            getattr(self.scaling_fwd, name).copy_(value)

    def extra_state(self) -> dict:
        """Tensors and plain values only (loadable with torch.load(weights_only=True))."""
        rec = self.recipe
        state = {"amax_history_fwd": self.scaling_fwd.amax_history.cpu(), "scale_fwd": self.scaling_fwd.scale.cpu(),
                 "amax_history_bwd": self.scaling_bwd.amax_history.cpu(), "scale_bwd": self.scaling_bwd.scale.cpu()}
        if rec is not None:
            state["recipe"] = type(rec).__name__
            state["fp8_format"] = rec.fp8_format.name
        return state

    def load_extra_state(self, state: dict) -> None:
        for direction, suffix in ((self.scaling_fwd, "fwd"), (self.scaling_bwd, "bwd")):
            history = state[f"amax_history_{suffix}"].to(direction.amax_history.device, torch.float32)
            if history.shape != direction.amax_history.shape:
                direction.amax_history = history.clone()
            else:
                direction.amax_history.copy_(history)
            direction.scale.copy_(state[f"scale_{suffix}"])
            direction.scale_inv.copy_(torch.reciprocal(direction.scale))
