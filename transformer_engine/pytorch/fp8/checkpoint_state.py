"""A GEMM module's FP8 state in a checkpoint (its `_extra_state`): the tensor encoding of
extra_state_codec.py, read back with the module's name in every error and checked against its
slots before it is loaded. (TransformerEngine's pickled states are classified, never
unpickled, by pytorch/_extra_state.py, at TE's path.)"""
import warnings

from torch import Tensor

from . import extra_state_codec


def decoded_extra_state(owner: str, state) -> dict:
    """set_extra_state's argument as a dict ({} for none, or for a foreign state, warned).
    Our encoding truncated or altered raises, naming the module and what is wrong."""
    if isinstance(state, Tensor):
        try:
            return extra_state_codec.decode(state)
        except extra_state_codec.ForeignExtraState as why:
            warnings.warn(f"{owner}: FP8 state in the checkpoint not loaded ({why}); the FP8 scales start afresh",
                          stacklevel=3)
            return {}
        except extra_state_codec.MalformedExtraState as why:
            raise extra_state_codec.MalformedExtraState(f"{owner}: the checkpoint's _extra_state (FP8 state) is "
                                                        f"malformed: {why}") from None
    if state and not isinstance(state, dict):
        raise extra_state_codec.MalformedExtraState(f"{owner}: _extra_state must be a uint8 tensor or a dict, got "
                                                    f"{type(state).__name__}")
    return dict(state) if state else {}


def check_fp8_state(owner: str, state: dict, forward_slots: int, backward_slots: int) -> None:
    """A decoded FP8 state has each direction's amax_history [history_len >= 1, slots] and scale
    [slots] as floating-point tensors, with the module's slot counts and one history length."""
    missing = [f"{name}_{suffix}" for suffix in ("fwd", "bwd") for name in ("amax_history", "scale")
               if f"{name}_{suffix}" not in state]
    if missing:
        raise extra_state_codec.MalformedExtraState(f"{owner}: the checkpoint's FP8 state lacks {missing} "
                                                    f"(it has {sorted(state)})")
    for suffix, slots, kind in (("fwd", forward_slots, "forward"), ("bwd", backward_slots, "backward")):
        history, scale = state[f"amax_history_{suffix}"], state[f"scale_{suffix}"]
        for name, value in ((f"amax_history_{suffix}", history), (f"scale_{suffix}", scale)):
            if not isinstance(value, Tensor) or not value.is_floating_point():
                raise extra_state_codec.MalformedExtraState(
                    f"{owner}: the checkpoint's FP8 state {name} must be a floating-point tensor, got "
                    f"{getattr(value, 'dtype', type(value).__name__)}")
        if history.dim() != 2 or history.shape[0] < 1 or history.shape[1] != slots or scale.shape != (slots,):
            saved = history.shape[-1] if history.dim() else 0
            raise extra_state_codec.MalformedExtraState(
                f"{owner}: the checkpoint's FP8 state has {saved} {kind} slots (amax_history_{suffix} "
                f"{tuple(history.shape)}, scale_{suffix} {tuple(scale.shape)}), this module {slots}: expected "
                f"[history_len, {slots}] and [{slots}]")
    if state["amax_history_fwd"].shape[0] != state["amax_history_bwd"].shape[0]:
        raise extra_state_codec.MalformedExtraState(
            f"{owner}: the checkpoint's FP8 amax histories differ in length: amax_history_fwd "
            f"{tuple(state['amax_history_fwd'].shape)}, amax_history_bwd {tuple(state['amax_history_bwd'].shape)}")
