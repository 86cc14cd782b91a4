"""What every module with FP8 state shares (the GEMM modules, TransformerEngineBaseModule,
te.ops' Quantize): the fp8_meta itself (TransformerEngine's slot layout) for the recipe of the
autocast region, read once per forward (_fp8_context) and handed on as a value; the step that
records an FP8 forward (_record_fp8_forward: its update scheduled, the forward kept for a
recompute, replayed by _recompute_replay.py); the quantizers TE's API reads; backward_dw for
delay_wgrad_compute; and the FP8 state in the state_dict as `_extra_state`
(fp8/checkpoint_state.py). The forward steps of the GEMM modules are _gemm_module.py's."""
import warnings
from typing import Callable, Optional

import torch
from torch import Tensor

from ...common.recipe import Recipe
from ..fp8 import extra_state_codec
from ..fp8.checkpoint_state import check_fp8_state, decoded_extra_state
from ..fp8.context import Fp8Context, current_context, defer_forward_update, replaying_a_forward
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.replay import ForwardRecord, forward_record, no_recompute_can_follow
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta
from ..dtensor import local_tensor
from ..quantization import QuantizerRole
from ..utils import default_device
from ..tensor.for_recipe import (DelayedSlotQuantizer, custom_answers, factory_quantizers, quantized_weight,
                                requested_delayed_scaling, slot_quantizer)


class Fp8ModuleMixin:
    """For an nn.Module with `fp8_meta` (None until first used under te.autocast). Subclasses
    set fp8_forward_slots / fp8_backward_slots: 3 and 2 per GEMM (forward: input, weight,
    output; backward: grad_output, grad_input)."""
    fp8_forward_slots = 3
    fp8_backward_slots = 2
    fp8_meta: Optional[Fp8Meta]

    def _new_meta(self, history_len: int, device: torch.device) -> Fp8Meta:
        # Normal tensors even when first made under torch.inference_mode(): a later training
        # step updates them in place, which inference tensors refuse.
        with torch.inference_mode(False):
            return Fp8Meta(forward_slots=self.fp8_forward_slots, backward_slots=self.fp8_backward_slots,
                           history_len=history_len, device=device)

    def _meta_for(self, recipe: Recipe, device: torch.device) -> Fp8Meta:
        """The module's FP8 state for `recipe` (a forward's, from its autocast context).
        Nothing is written while the state serves the recipe (Fp8Meta.serves); otherwise
        _remade_meta."""
        meta = self.fp8_meta
        if meta is None or not meta.serves(recipe):
            meta = self._remade_meta(recipe, device)
        return meta

    def _remade_meta(self, recipe: Recipe, device: torch.device) -> Fp8Meta:
        """The state made afresh on first use and when the recipe's kind or amax history length
        changes (with TE's warnings: the scales start over), else the state kept; either way
        recording (Fp8Meta.make_for) the recipe it now serves. A CustomRecipe's factory is asked
        for the slots' quantizers when the module first runs under that recipe object."""
        meta = self.fp8_meta
        made = None
        if recipe.custom() and (meta is None or meta.custom is None or not meta.custom.asked_by(recipe)):
            made = factory_quantizers(recipe, self._quantizer_roles())
        if recipe.delayed():
            delayed = recipe
        elif made is not None:
            delayed = requested_delayed_scaling(made)
        else:  # the same recipe object as before keeps its requests' parameters
            delayed = meta.custom.delayed_scaling if recipe.custom() else None
        history_len = delayed.amax_history_len if delayed is not None else 1
        # The recipe the module's state (or, before any, its FP8 weights) was made for.
        quantization = getattr(self, "weight_quantization", None)
        previous = meta.made_for if meta is not None else getattr(quantization, "recipe", None)
        changed_type = previous is not None and type(previous) is not type(recipe)
        if changed_type:
            warnings.warn(f"Recipe type changed from {type(previous).__name__} to {type(recipe).__name__} for "
                          f"{type(self).__name__}: its FP8 scaling state starts afresh")
        elif previous is not None and _history_len(previous) != history_len and any(
                isinstance(local_tensor(p), QuantizedTensor) for p in self.parameters()):
            warnings.warn(f"Quantizer is being updated, this may affect model behavior: {type(self).__name__}'s "
                          f"amax history length changes from {_history_len(previous)} to {history_len}, and "
                          f"its FP8 scaling state starts afresh")
        if changed_type or meta is None or meta.scaling_fwd.amax_history.shape[0] != history_len:
            if recipe.float8_per_tensor_scaling() and torch.compiler.is_compiling():
                _create_meta_outside_graph(self, history_len, device)
            else:
                self.fp8_meta = self._new_meta(history_len, device)
            meta = self.fp8_meta
            if recipe.custom() and made is None:  # the kept answers were bound to the old state
                made = factory_quantizers(recipe, self._quantizer_roles())
        custom = None
        if recipe.custom():
            custom = custom_answers(recipe, made, meta) if made is not None else meta.custom
        meta.make_for(recipe, custom)
        return meta

    def _quantizer_roles(self) -> dict:
        """The QuantizerRole of each slot, as a CustomRecipe's factory is asked for it
        (TransformerEngine's roles): per GEMM, forward (input, weight, output) and backward
        (grad_output, grad_input) of module_type 'linear' with the module's name; None for the
        output and the input gradient, whose consumer is not known here."""
        name = getattr(self, "name", None) or ""
        gemms = self.fp8_forward_slots // 3
        forward = [QuantizerRole("linear", "input", name), QuantizerRole("linear", "weight", name), None] * gemms
        return {FORWARD: forward, BACKWARD: [QuantizerRole("linear", "grad_output", name), None] * gemms}

    def stored_weight(self, values: Tensor, weight_slot: int) -> torch.nn.Parameter:
        """`values` as the FP8 parameter te.quantized_model_init asks for. Under DelayedScaling
        the weight is cast, now and on every write (an optimizer step), with the scale of its
        forward slot in this module's fp8_meta, and records its amax there, as TE's weights do:
        the delayed update then moves that scale like any other slot's (scale 1 to start).
        Under a CustomRecipe, with the quantizer its factory gives the module's weight slot."""
        recipe = self.weight_quantization.recipe
        quantizer = None
        if recipe.delayed() or recipe.custom():
            quantizer = slot_quantizer(recipe, self._meta_for(recipe, values.device), FORWARD, weight_slot)
        return quantized_weight(self.weight_quantization, values, quantizer)

    @property
    def quantizers(self) -> dict:
        """TE's view of the FP8 state: {"scaling_fwd": one quantizer per forward slot,
        "scaling_bwd": one per backward slot}, for the recipe the state was made for (empty
        lists before any FP8 forward). Delayed scaling's read and write the module's own scale
        and amax."""
        meta = self.fp8_meta
        if meta is None or meta.made_for is None:
            return {FORWARD: [], BACKWARD: []}
        return {key: [slot_quantizer(meta.made_for, meta, key, slot) for slot in range(meta[key].scale.numel())]
                for key in (FORWARD, BACKWARD)}

    def get_quantizer(self, mode: str, index: int):
        """quantizers[...][index] for mode 'forward' or 'backward' (TE's op API)."""
        if mode not in ("forward", "backward"):
            raise ValueError(f"get_quantizer: mode must be 'forward' or 'backward', got {mode!r}")
        return self.quantizers[FORWARD if mode == "forward" else BACKWARD][index]

    @property
    def _fp8_metas(self) -> Optional[dict]:
        """TE's ops keep their FP8 state as {"forward": {"scaling_fwd": ...}, "backward":
        {"scaling_bwd": ...}}: the same state as fp8_meta, so arranged."""
        meta = self.fp8_meta
        if meta is None:
            return None
        return {"forward": {FORWARD: meta[FORWARD]}, "backward": {BACKWARD: meta[BACKWARD]}}

    # The last FP8 forward, for a torch.utils.checkpoint recompute of it (replays_fp8_forward).
    _fp8_forward_record: Optional[ForwardRecord] = None

    def _fp8_context(self) -> Optional[Fp8Context]:
        """The te.autocast region this forward's GEMMs follow (None outside every region), read
        once per forward and handed on. A forward in high precision, other than a replay,
        forgets the last FP8 forward's record: a later recompute repeats it in high precision."""
        context = current_context()
        if (self._fp8_forward_record is not None and (context is None or not context.enabled)
                and not replaying_a_forward()):
            self._keep_fp8_forward_record(None)
        return context

    def _fp8_meta(self, context: Fp8Context, device: torch.device) -> Fp8Meta:
        """The FP8 state this forward's GEMMs cast with, for the recipe of its autocast context
        (_meta_for). A forward that casts with it then records itself (_record_fp8_forward)."""
        return self._meta_for(context.recipe, device)

    def _record_fp8_forward(self, meta: Fp8Meta) -> None:
        """The step every FP8 forward takes once it has its state: the forward update of `meta`
        scheduled for the outermost region's exit (not in a replay: the original forward's
        did), and, outside a replay, the forward recorded for a recompute (even without
        autograd: a reentrant checkpoint runs the original forward under no_grad, and only its
        recompute builds the graph; not under torch.inference_mode, after which none can follow)."""
        defer_forward_update(meta)
        if not replaying_a_forward():
            self._keep_fp8_forward_record(None if no_recompute_can_follow() else forward_record(meta))

    def _keep_fp8_forward_record(self, record: Optional[ForwardRecord]) -> None:
        # Into the instance's dict: nn.Module.__setattr__'s parameter, buffer and submodule
        # checks took 2.5 us of every FP8 forward (2 Zen 3 cores) for this plain attribute.
        self.__dict__["_fp8_forward_record"] = record

    def need_backward_dw(self) -> bool:
        """Whether backward_dw() has work to do: the module defers its weight gradients."""
        return self.delay_wgrad_compute

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """hook() runs at the end of every backward_dw(), once the deferred gradients are in
        place (Megatron-Core starts their reduction from it), as in TE."""
        self.wgrad_accumulation_and_reduce_hooks.append(hook)

    def backward_dw(self) -> None:
        """With delay_wgrad_compute=True: computes the weight (and bias) gradients that the
        backward passes since the last call deferred (none for frozen parameters), in the order
        those passes ran, and accumulates them; each without building a graph, and dropping
        what its backward saved for it (_linear_function.DeferredGradients). Then the hooks of
        register_wgrad_accumulation_and_reduce_hooks run. Nothing without delay_wgrad_compute."""
        if not self.need_backward_dw():
            return
        pending, self._deferred_wgrad[:] = list(self._deferred_wgrad), []
        for compute in pending:
            compute()
        for hook in self.wgrad_accumulation_and_reduce_hooks:
            hook()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint saved without FP8 state (or by a plain torch module) has no
        # _extra_state: load it as "no FP8 state" instead of reporting a missing key.
        state_dict.setdefault(prefix + "_extra_state", extra_state_codec.empty())
        restored = []
        if any(isinstance(local_tensor(p), QuantizedTensor) for p in self.parameters(recurse=False)):
            # FP8 weights kept under DelayedScaling are cast with this module's scales when
            # written: those scales must be the checkpoint's before the weights are copied in.
            # (torch then loads the state once more, after the parameters, which puts back
            # the amax history the copies recorded into.)
            self.set_extra_state(state_dict[prefix + "_extra_state"])
            restored = self._cast_weights_as_saved(state_dict[prefix + "_extra_state"])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        for name, scale_inv in restored:  # the codes' own scale_inv, bit for bit
            local_tensor(getattr(self, name))._scale_inv.copy_(scale_inv)

    def _weight_scale_invs(self) -> dict:
        """`scale_inv.<name>` of each FP8 parameter cast by a delayed-scaling slot of this module: the
        scale its codes were cast with, which the slot's own scale has moved on from since
        (the delayed update follows each forward, the weights are cast at each optimizer step)."""
        found = {}
        for name, param in self.named_parameters(recurse=False):
            tensor = local_tensor(param)
            if isinstance(tensor, QuantizedTensor) and isinstance(tensor._storage.quantizer, DelayedSlotQuantizer):
                found[f"scale_inv.{name}"] = tensor._scale_inv.detach().cpu()
        return found

    def _cast_weights_as_saved(self, extra_state) -> list:
        """Before the parameters load: each per-tensor FP8 weight's slot takes 1 / the scale_inv
        its saved codes were cast with, so that the saved values (code * scale_inv, rounded to
        the parameter's dtype: within 2^-9 of it) cast back to the same codes (the nearest FP8
        value is at least 2^-4 away); returns (name, scale_inv) for the weights to take the saved
        scale_inv exactly. The slots' own scales come back with the state torch loads after."""
        state = decoded_extra_state(type(self).__name__, extra_state)
        restored = []
        for name, param in self.named_parameters(recurse=False):
            scale_inv = state.get(f"scale_inv.{name}")
            quantizer = getattr(getattr(local_tensor(param), "_storage", None), "quantizer", None)
            if scale_inv is None or not isinstance(quantizer, DelayedSlotQuantizer) or self.fp8_meta is None:
                continue
            scale_inv = scale_inv.to(self.fp8_meta.scaling_fwd.scale.device, torch.float32).reshape(1)
            group = self.fp8_meta[quantizer.direction]
            group.scale[quantizer.slot:quantizer.slot + 1].copy_(torch.reciprocal(scale_inv))
            restored.append((name, scale_inv))
        return restored

    def _state_device(self) -> torch.device:
        """Where a loaded FP8 state lives: with the state the module has, else its first
        parameter (or buffer); a module with neither (DotProductAttention) keeps it on the
        default device."""
        if self.fp8_meta is not None:
            return self.fp8_meta.scaling_fwd.scale.device
        tensor = next(self.parameters(), None)
        if tensor is None:
            tensor = next(self.buffers(), None)
        return tensor.device if tensor is not None else default_device()

    def get_extra_state(self) -> Tensor:
        """The FP8 state as one uint8 tensor (fp8/extra_state_codec.py), empty without FP8; with
        the scale_inv of each per-tensor FP8 weight (_weight_scale_invs)."""
        if self.fp8_meta is None:
            return extra_state_codec.encode({})
        return extra_state_codec.encode({**self.fp8_meta.extra_state(), **self._weight_scale_invs()})

    def set_extra_state(self, state) -> None:
        """Accepts our encoded state, our earlier dict form, an empty one (checkpoint saved
        without FP8) or None. TransformerEngine's pickled state is not unpickled: the FP8
        scales then start afresh, with a warning."""
        state = decoded_extra_state(type(self).__name__, state)
        if not state:
            return
        check_fp8_state(type(self).__name__, state, self.fp8_forward_slots, self.fp8_backward_slots)
        history_len = state["amax_history_fwd"].shape[0]
        device = self._state_device()
        if self.fp8_meta is None or self.fp8_meta.scaling_fwd.amax_history.shape[0] != history_len:
            self.fp8_meta = self._new_meta(history_len, device)
        self.fp8_meta.load_extra_state(state)


def _history_len(recipe: Recipe) -> int:
    return recipe.amax_history_len if recipe.delayed() else 1


def per_tensor_fp8_meta_is_created_outside_the_graph(module: Fp8ModuleMixin, history_len: int,
                                                    device: torch.device) -> None:
    """Under torch.compile, the fp8_meta of a per-tensor recipe (DelayedScaling,
    Float8CurrentScaling) is made eagerly, between two graphs, on the module's first FP8 forward
    (and when the amax history length changes). Their backward writes the gradient's amax and
    scale into its buffers, and AOTAutograd cannot compile a backward that mutates tensors made
    inside the forward graph (it fails with "Node ... was invalid, but is output"); buffers that
    already exist are graph inputs, which it can. Later calls trace into one graph, so
    fullgraph=True works once one FP8 forward has run (eagerly, or compiled without fullgraph).
    The block recipes keep no state and make theirs inside the graph."""
    module.fp8_meta = module._new_meta(history_len, device)


# torch._disable_dynamo is torch.compiler.disable that imports torch._dynamo (over a second)
# on its first call rather than when this module is imported.
_create_meta_outside_graph = torch._disable_dynamo(per_tensor_fp8_meta_is_created_outside_the_graph)
