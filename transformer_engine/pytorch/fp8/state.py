"""Per-module FP8 state (TransformerEngine's fp8_meta): what the per-tensor quantizers of its
slots (tensor/for_recipe.py) cast with and record into, and the delayed-scaling update.

module.fp8_meta["scaling_fwd"] and ["scaling_bwd"] each hold, for their slots (a Linear:
forward 0 input, 1 weight, 2 output; backward 0 grad_output, 1 grad_input):
    amax_history [amax_history_len, slots] fp32, row 0 live, zeros at start
    scale [slots] fp32, ones at start;  scale_inv [slots] = 1 / scale
They are non-persistent buffers (they follow .to(device)); checkpoints carry them through the
owning module's _extra_state (see extra_state()).

The state knows nothing of autocast regions or recomputes (context.py and replay.py do): a
forward casts with the recipe of its autocast context, handed to the quantizers as a value;
the state keeps a copy of the recipe it was made for (what its checkpoint names, what the
delayed-scaling update follows, what module.quantizers shows outside a forward).
"""
import copy
import weakref
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ...common import recipe as recipes
from .block_tensor import Float8BlockPair
from .nvfp4_operand import Nvfp4Pair
from .codes import Float8Codes
from ..custom_ops.delayed_scaling import delayed_scaling_update_
from ..scaling import update_delayed_scaling

FORWARD, BACKWARD = "scaling_fwd", "scaling_bwd"
Fp8Operand = Union[Float8Codes, Float8BlockPair, Nvfp4Pair]  # what a quantizer's operand_of() gives a GEMM
WEIGHT_SLOT = 1  # forward slots come in (input, weight, output) triples, one per GEMM


def feeds_backward(operand: Fp8Operand) -> bool:
    """Whether a cast operand can also feed the backward GEMMs: per-tensor codes transpose on
    demand; block-scaled ones (FP8 blocks, NVFP4) need the column-wise copy, made only when a
    backward was due."""
    return not isinstance(operand, (Float8BlockPair, Nvfp4Pair)) or operand.columnwise is not None


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


class CustomAnswers:
    """What a CustomRecipe's factory answered for a module's slots (tensor/for_recipe.py's
    factory_quantizers): {FORWARD: [...], BACKWARD: [...]} quantizers, and the DelayedScaling
    its DelayedScalingRequests make (None without requests). As in TE, a factory is asked once
    per recipe object, and the answers are kept across steps so that a stateful quantizer keeps
    its state. The recipe object is named by a weak reference, which does not keep it alive; a
    pickled or deep-copied module drops it, and asks the factory again on its next forward."""

    def __init__(self, recipe: recipes.Recipe, quantizers: dict, delayed_scaling: Optional[recipes.DelayedScaling]):
        self.quantizers = quantizers
        self.delayed_scaling = delayed_scaling
        self._asked_by = weakref.ref(recipe)

    def asked_by(self, recipe: recipes.Recipe) -> bool:
        return self._asked_by is not None and self._asked_by() is recipe

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_asked_by": None}  # a weak reference cannot be pickled


class Fp8Meta(torch.nn.Module):
    """fp8_meta["scaling_fwd"] / ["scaling_bwd"], the recipe they were made for (made_for: a
    copy, so that nothing the caller does to its recipe object later reaches the state), and a
    CustomRecipe's answers."""

    def __init__(self, forward_slots: int, backward_slots: int, history_len: int, device: torch.device):
        super().__init__()
        self.scaling_fwd = ScalingGroup(forward_slots, history_len, device)
        self.scaling_bwd = ScalingGroup(backward_slots, history_len, device)
        self.made_for: Optional[recipes.Recipe] = None  # None until a forward uses the state
        self.custom: Optional[CustomAnswers] = None

    def serves(self, recipe: recipes.Recipe) -> bool:
        """Whether the state was made for `recipe`: equal in value to made_for, and for a
        CustomRecipe the very object whose factory answered."""
        return self.made_for == recipe and (self.custom is None or self.custom.asked_by(recipe))

    def make_for(self, recipe: recipes.Recipe, custom: Optional[CustomAnswers]) -> None:
        """Records the recipe (a copy) and a CustomRecipe's answers this state now serves: on
        its first forward and when a forward's recipe differs from made_for in value."""
        self.made_for = copy.copy(recipe)
        self.custom = custom

    @property
    def delayed_scaling(self) -> Optional[recipes.DelayedScaling]:
        """The delayed-scaling parameters update() follows: the recipe when it is DelayedScaling,
        a CustomRecipe's DelayedScalingRequest made into one; None: nothing to update."""
        if self.made_for is not None and self.made_for.delayed():
            return self.made_for
        return self.custom.delayed_scaling if self.custom is not None else None

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
        buffers = self[direction]._buffers  # one lookup per tensor, not nn.Module's __getattr__ (every cast asks)
        live = buffers["amax_history"][0, slot]
        torch.maximum(live, amax.to(torch.float32).reshape(()), out=live)
        buffers["amax_recorded"].select(0, slot).fill_(True)

    def slot_scale(self, direction: str, slot: int) -> Tensor:
        """The scale a cast of this slot uses, [1] fp32 (a view: the slot's own)."""
        return self[direction].scale[slot:slot + 1]

    def keep_current_scale(self, direction: str, slot: int, amax: Tensor, scale: Tensor, scale_inv: Tensor) -> None:
        """Current scaling: the slot keeps the last cast's amax [1], scale [1] and scale_inv [1]
        (the cast's 1 / scale), for inspection and checkpoints; nothing is computed from them."""
        scaling = self[direction]
        kept = [scaling.scale[slot:slot + 1], scaling.scale_inv[slot:slot + 1], scaling.amax_history[0, slot:slot + 1]]
        torch._foreach_copy_(kept, [scale.reshape(1), scale_inv.reshape(1), amax.reshape(1)])

    def update(self, direction: str, group: Optional[object] = None) -> None:
        """Delayed-scaling update of one direction (no-op for recipes that scale from the
        current tensor): reduce the live amaxes over `group`, then the pure update."""
        update_together([self], direction, group)

    def update_forward(self, group: Optional[object]) -> None:
        self.update(FORWARD, group)

    @staticmethod
    def update_forwards(metas: Sequence["Fp8Meta"], group: Optional[object]) -> None:
        """The forward update of every state an autocast region used, done together (context.py)."""
        update_together(metas, FORWARD, group)

    def forward_state(self, with_history: bool = True) -> dict:
        """Copies of the forward scale, scale_inv and (with_history) amax_history: a recompute
        casts with the scales its forward used, then puts the whole state back (replay.py)."""
        # Dict lookups, not nn.Module's __getattr__: every FP8 forward under delayed scaling keeps
        # its scales this way (replay.forward_record).
        buffers = self._modules[FORWARD]._buffers
        names = ("scale", "scale_inv") + (("amax_history", "amax_recorded") if with_history else ())
        return {name: buffers[name].clone() for name in names}

    def load_forward_state(self, state: dict) -> None:
        """Writes forward_state()'s copies back, in place (the buffers keep their identity)."""
        for name, value in state.items():
            getattr(self.scaling_fwd, name).copy_(value)

    def extra_state(self) -> dict:
        """Tensors and plain values only (loadable with torch.load(weights_only=True))."""
        rec = self.made_for
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


def update_together(metas: Sequence[Fp8Meta], direction: str, group: Optional[object]) -> None:
    """Delayed-scaling update of one direction of several FP8 states, as TE's fused update of
    its global buffers: the states that follow equal DelayedScaling parameters (and history
    lengths) are updated together, their live amaxes reduced over `group` in one collective.
    The recipe's "max" / "most_recent" algorithms run as one op over them all
    (custom_ops/delayed_scaling.py); a callable algorithm sees their histories joined as one
    [len, slots of them all], as TE's does. States of recipes that scale from the current
    tensor have nothing to update."""
    batches: List[Tuple[recipes.DelayedScaling, tuple, List[ScalingGroup]]] = []
    for meta in metas:
        rec = meta.delayed_scaling
        if rec is None:
            continue
        # Dict lookups, not nn.Module's __getattr__: this loop runs over every FP8 state at
        # every autocast exit (in decoding, once per token).
        scaling = meta._modules[direction]
        history = scaling._buffers["amax_history"]
        joins_with = (history.shape[0], history.device)  # what the histories joined must share
        batch = next((groups for batch_rec, batch_key, groups in batches
                      if batch_key == joins_with and batch_rec == rec), None)
        if batch is None:
            batches.append((rec, joins_with, [scaling]))
        else:
            batch.append(scaling)
    for rec, _, groups in batches:
        limits = rec.fp8_format.value
        fp8_max = limits.max_fwd if direction == FORWARD else limits.max_bwd
        if rec.reduce_amax and _reduces_over(group):
            _reduce_live_amaxes(groups, group)
        # Under torch.compile the update is traced as plain ops (the compiler fuses them): the op,
        # which writes four lists of buffers in place, gave inductor-compiled backwards whose
        # FP8 weight gradients differed from eager (tests/fp8/test_fp8_compile.py).
        if (callable(rec.amax_compute_algo) or rec.scaling_factor_compute_algo is not None
                or torch.compiler.is_compiling()):
            _update_joined(groups, rec, fp8_max)
        else:
            states = [scaling._buffers for scaling in groups]  # one lookup per tensor, not nn.Module's __getattr__
            delayed_scaling_update_([state["amax_history"] for state in states], [state["scale"] for state in states],
                                    [state["scale_inv"] for state in states],
                                    [state["amax_recorded"] for state in states], rec.amax_compute_algo, fp8_max,
                                    rec.margin)


def _joined(tensors: List[Tensor], dim: int) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


def _reduce_live_amaxes(groups: List[ScalingGroup], group: Optional[object]) -> None:
    """The live amaxes of `groups` and which slots recorded one, each the maximum over the
    ranks of `group` (a slot any rank recorded updates on every rank), written back."""
    live = _joined([scaling.amax_history[0] for scaling in groups], dim=0)  # [slots]
    # A slot took part in this step if it recorded an amax through record_amax, or if
    # anything else (a quantizer viewing the slot, TE code) wrote a live amax.
    recorded = (_joined([scaling.amax_recorded for scaling in groups], dim=0) | (live != 0)).float()
    reduce_amax(live, group)
    reduce_amax(recorded, group)
    slots = [scaling.scale.shape[0] for scaling in groups]
    torch._foreach_copy_([scaling.amax_history[0] for scaling in groups], live.split(slots))
    torch._foreach_copy_([scaling.amax_recorded for scaling in groups], (recorded > 0).split(slots))


def _update_joined(groups: List[ScalingGroup], rec: recipes.DelayedScaling, fp8_max: float) -> None:
    """One DelayedScaling update of `groups` as one history [len, their slots], in plain ops (a
    recipe with callable algorithms, or a traced update): the new history and scale are
    computed for the joined slots by scaling.update_delayed_scaling, then written back to each
    group."""
    history = _joined([scaling.amax_history for scaling in groups], dim=1)  # [len, slots]
    scale = _joined([scaling.scale for scaling in groups], dim=0)  # [slots]
    recorded = _joined([scaling.amax_recorded for scaling in groups], dim=0) | (history[0] != 0)
    new_history, new_scale = update_delayed_scaling(history, scale, fp8_max, rec)
    new_scale = torch.where(recorded, new_scale, scale)
    new_history = torch.where(recorded, new_history, history)
    new_scale_inv = torch.reciprocal(new_scale)
    slots = [scaling.scale.shape[0] for scaling in groups]
    torch._foreach_copy_([scaling.amax_history for scaling in groups], new_history.split(slots, dim=1))
    torch._foreach_copy_([scaling.scale for scaling in groups], new_scale.split(slots))
    torch._foreach_copy_([scaling.scale_inv for scaling in groups], new_scale_inv.split(slots))
    torch._foreach_zero_([scaling.amax_recorded for scaling in groups])


def _reduces_over(group: Optional[object]) -> bool:
    """Whether amaxes are reduced over `group` (None: the default group): it has more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def reduce_amax(amax: Tensor, group: Optional[object]) -> None:
    """All-reduce (MAX) amaxes in place over `group` (None: the default group) when it has more
    than one rank."""
    if _reduces_over(group):
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
