"""How TransformerEngine's pickled module `_extra_state` is classified, without unpickling it.

This package never unpickles a checkpoint (its own `_extra_state` is the tensor encoding of
fp8/extra_state_codec.py). A TE checkpoint's pickled state is read as opcodes only
(pickletools): state of stateless recipes carries nothing and is ignored; FP8 delayed-scaling
state (or anything unrecognised) is refused, since loading it would mean executing the pickle.
TE lets users opt in through an environment variable, named here for code that sets it; this
package does not read it.
"""
import enum
import pickletools
from typing import Optional, Tuple

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"

_RECIPE_MODULE = "transformer_engine.common.recipe"
_DELAYED_SCALING_KEYS = frozenset({"scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"})
_STRING_OPCODES = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "BINUNICODE8",
                             "SHORT_BINUNICODE"})


class CheckpointExtraStatePolicy(enum.Enum):
    STATELESS = "stateless"
    STATEFUL_FP8_DELAYED_SCALING = "stateful_fp8_delayed_scaling"
    DYNAMIC = "dynamic"


_RECIPE_POLICIES = {
    (_RECIPE_MODULE, "DelayedScaling"): CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING,
    (_RECIPE_MODULE, "Float8CurrentScaling"): CheckpointExtraStatePolicy.STATELESS,
    (_RECIPE_MODULE, "MXFP8BlockScaling"): CheckpointExtraStatePolicy.STATELESS,
    (_RECIPE_MODULE, "Float8BlockScaling"): CheckpointExtraStatePolicy.STATELESS,
    (_RECIPE_MODULE, "NVFP4BlockScaling"): CheckpointExtraStatePolicy.STATELESS,
    (_RECIPE_MODULE, "CustomRecipe"): CheckpointExtraStatePolicy.DYNAMIC,
}


def _globals_and_strings(data: bytes) -> Tuple[list, list]:
    """The (module, name) globals a pickle names and its string constants, read as opcodes."""
    found, strings = [], []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name in _STRING_OPCODES:
            text = arg.decode("latin-1") if isinstance(arg, bytes) else arg
            strings.append(text)
        elif opcode.name == "GLOBAL":
            module, _, name = str(arg).partition(" ")
            found.append((module, name))
        elif opcode.name == "STACK_GLOBAL":
            found.append(tuple(strings[-2:]) if len(strings) >= 2 else None)
    return found, strings


def _is_stateless(data: bytes) -> Optional[bool]:
    """True for state that carries nothing to load; False for delayed-scaling state; None when
    it cannot be told (TE 1.x state without a recipe, unknown recipes, malformed bytes)."""
    try:
        found, strings = _globals_and_strings(data)
    except Exception:  # malformed pickle bytes: not identifiable
        return None
    if any(text in _DELAYED_SCALING_KEYS for text in strings):
        return False
    if not found:  # no global: nothing callable, nothing stateful (an empty dict)
        return True
    policies = {_RECIPE_POLICIES.get(ref) for ref in found if ref is not None} - {None}
    if "recipe" not in strings or not policies:
        return None
    return CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING not in policies


def should_load_extra_state_pickle(data: bytes, context: str) -> bool:
    """False when the pickled state can be ignored (empty or stateless); RuntimeError naming
    `context` otherwise: this package never unpickles."""
    if not data or _is_stateless(data):
        return False
    raise RuntimeError(f"{context}: refusing TransformerEngine's pickled FP8 extra state (loading it would execute "
                       f"a pickle; this package never unpickles checkpoints). Re-save it with this package, or "
                       f"load the weights without the FP8 state.")
