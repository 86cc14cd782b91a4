"""te.convert_model: swap a model's torch.nn.Linear / LayerNorm / RMSNorm for te.Linear /
te.LayerNorm / te.RMSNorm in place, keeping its Parameter objects.

The rules, in the order they are applied to each submodule (a module shared by several parents
is decided once and replaced everywhere):
  * modules of this package are left alone, and not descended into;
  * filter_fn(module, qualified_name) is asked about each candidate; False leaves it;
  * a candidate with forward hooks, a patched `forward`, or parameters, buffers or submodules
    beyond its own weight/bias is left (the replacement would silently drop them);
  * Linear: torch.nn.Linear and subclasses that do not override forward (such as
    NonDynamicallyQuantizableLinear), with a plain floating-point Parameter as weight.
    Subclasses with their own forward (LoRA, quantised linears) compute something else and
    are left;
  * LayerNorm / RMSNorm: torch.nn.LayerNorm and torch.nn.RMSNorm (their math is known; a
    missing weight or bias - elementwise_affine=False, bias=False - becomes a constant
    non-persistent buffer of ones / zeros, so parameters and state_dict keys do not change;
    eps=None of RMSNorm becomes fp32's machine epsilon, which torch uses for fp32, fp16 and bf16
    inputs). Subclasses that override forward, and classes whose name ends in "RMSNorm" or
    "LayerNorm" with a `weight` Parameter and an `eps` or `variance_epsilon` (Hugging Face's
    LlamaRMSNorm, GemmaRMSNorm, T5LayerNorm - an RMSNorm by its math -, ...) are first run
    beside the candidate replacement on a small fp32 probe (copies, random weights, rows of
    very different scales so eps matters); they are replaced only when the outputs agree,
    trying zero_centered_gamma=True (y = x_hat * (1 + weight), Gemma's norm) when the plain
    form does not. A "LayerNorm"-named class without a bias is tried as te.RMSNorm first, then
    as te.LayerNorm (with a constant zero bias).
Each conversion and each skip is logged on logging.getLogger("transformer_engine").
"""
import copy
import logging
import numbers
from typing import Callable, Dict, Optional, Tuple

import torch

from .module import LayerNorm, Linear, RMSNorm

logger = logging.getLogger("transformer_engine")

_TORCH_RMSNORM = getattr(torch.nn, "RMSNorm", None)
_PROBE_ROW_SCALES = (1.0, 1e-3, 30.0, 1e-2)  # rows where eps dominates and where it vanishes
_PROBE_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # fp32 rounding passes; a different formula does not


class _Skip(Exception):
    """Why a candidate stays as it is."""


def convert_model(model: torch.nn.Module, *, filter_fn: Optional[Callable[[torch.nn.Module, str], bool]] = None
                  ) -> torch.nn.Module:
    """Replaces, in place, the Linear, LayerNorm and RMSNorm submodules of `model` by te.Linear,
    te.LayerNorm and te.RMSNorm (rules in this module's docstring).

    The replacements take over the original Parameter objects (not copies), so tied weights, an
    optimizer already holding them, dtype, device and requires_grad are unchanged; so is each
    module's training flag. filter_fn(module, qualified_name) -> bool is asked about every
    candidate (qualified_name as in named_modules(); "" for `model` itself); False leaves it.
    Returns `model`, or its replacement when `model` itself is a candidate.
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"convert_model: model must be a torch.nn.Module, got {type(model).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise ValueError(f"convert_model: filter_fn must be callable(module, qualified_name), got {filter_fn!r}")
    # id(original) -> (original, what replaces it); holding the original keeps its id unique.
    decided: Dict[int, Tuple[torch.nn.Module, torch.nn.Module]] = {}
    root = _decide(model, "", filter_fn, model, decided)
    if root is model and not _is_ours(model):
        _convert_children(model, "", filter_fn, model, decided)
    return root


def _convert_children(parent: torch.nn.Module, prefix: str, filter_fn, model: torch.nn.Module,
                      decided: Dict[int, Tuple[torch.nn.Module, torch.nn.Module]]) -> None:
    for name, child in list(parent._modules.items()):
        if child is None:
            continue
        if id(child) in decided:  # shared module: already decided under another name
            if decided[id(child)][1] is not child:
                setattr(parent, name, decided[id(child)][1])
            continue
        qualified = prefix + name
        new = _decide(child, qualified, filter_fn, model, decided)
        if new is not child:
            setattr(parent, name, new)
        elif not _is_ours(child):
            _convert_children(child, qualified + ".", filter_fn, model, decided)


def _decide(module: torch.nn.Module, name: str, filter_fn, model: torch.nn.Module,
            decided: Dict[int, Tuple[torch.nn.Module, torch.nn.Module]]) -> torch.nn.Module:
    """The replacement of `module`, or `module` itself (logging why)."""
    decided[id(module)] = (module, module)
    kind = _candidate_kind(module)
    if kind is None or _is_ours(module):
        return module
    label = f"{name or '<model>'} ({type(module).__name__})"
    if filter_fn is not None and not filter_fn(module, name):
        logger.info("convert_model: left %s: filter_fn returned False", label)
        return module
    try:
        _check_nothing_lost(module)
        new, note = _convert_linear(module) if kind == "linear" else _convert_norm(module, kind, model)
    except _Skip as why:
        logger.warning("convert_model: left %s: %s", label, why)
        return module
    new.train(module.training)
    decided[id(module)] = (module, new)
    logger.info("convert_model: %s -> te.%s%s", label, type(new).__name__, note)
    return new


def _is_ours(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("transformer_engine.")


def _overrides_forward(module: torch.nn.Module, base: type) -> bool:
    return type(module).forward is not base.forward


def _candidate_kind(module: torch.nn.Module) -> Optional[str]:
    if isinstance(module, torch.nn.Linear):
        return "linear"
    if isinstance(module, torch.nn.LayerNorm):
        return "layernorm"
    if _TORCH_RMSNORM is not None and isinstance(module, _TORCH_RMSNORM):
        return "rmsnorm"
    if isinstance(getattr(module, "weight", None), torch.nn.Parameter):
        if type(module).__name__.endswith("RMSNorm"):
            return "rmsnorm"
        if type(module).__name__.endswith("LayerNorm"):
            return "named_norm"  # which formula it computes, the probe decides
    return None


def _check_nothing_lost(module: torch.nn.Module) -> None:
    """Refuses modules whose replacement would drop behaviour or state."""
    hooks = [kind for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(module, kind, None)]
    if hooks:
        raise _Skip(f"it has hooks ({', '.join(hooks)}) the replacement would not carry")
    if "forward" in vars(module):
        raise _Skip("its forward is patched on the instance")
    extra = sorted(set(module._parameters) - {"weight", "bias"}) + sorted(module._buffers) + sorted(module._modules)
    if extra:
        raise _Skip(f"it holds more than weight and bias ({', '.join(extra)})")
    for name, param in module._parameters.items():
        if param is None:
            continue
        if type(param) is not torch.nn.Parameter or not param.dtype.is_floating_point:
            raise _Skip(f"its {name} is a {type(param).__name__} of {param.dtype} (quantised or sharded), "
                        "not a floating-point Parameter")


def _convert_linear(module: torch.nn.Linear) -> Tuple[Linear, str]:
    if _overrides_forward(module, torch.nn.Linear):
        raise _Skip("a torch.nn.Linear subclass with its own forward (LoRA, quantised, ...) does more than "
                    "x W^T + b")
    weight, bias = module.weight, module.bias
    new = Linear(weight.shape[1], weight.shape[0], bias=bias is not None, params_dtype=weight.dtype, device="meta")
    new.weight = weight  # the Parameter object itself: ties and optimizers keep working
    if bias is not None:
        new.bias = bias
    return new, "" if bias is not None else " (no bias)"


def _norm_spec(module: torch.nn.Module, kind: str) -> Tuple[tuple, float, bool]:
    """(normalized_shape, eps, math_known): math_known when the module computes torch's own
    LayerNorm / RMSNorm (a torch class, or a subclass that keeps its forward)."""
    if isinstance(module, torch.nn.LayerNorm):
        return tuple(module.normalized_shape), float(module.eps), not _overrides_forward(module, torch.nn.LayerNorm)
    if _TORCH_RMSNORM is not None and isinstance(module, _TORCH_RMSNORM):
        eps = module.eps if module.eps is not None else torch.finfo(torch.float32).eps
        return tuple(module.normalized_shape), float(eps), not _overrides_forward(module, _TORCH_RMSNORM)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise _Skip("its name says it is a norm but it has no numeric eps or variance_epsilon")
    if kind == "rmsnorm" and "bias" in module._parameters and module.bias is not None:
        raise _Skip("an RMSNorm with a bias is not te.RMSNorm's formula")
    return tuple(module.weight.shape), float(eps), False


def _convert_norm(module: torch.nn.Module, kind: str, model: torch.nn.Module) -> Tuple[torch.nn.Module, str]:
    shape, eps, math_known = _norm_spec(module, kind)
    zero_centered = False
    if kind == "named_norm":
        kind, zero_centered = _probe_formula(module, shape, eps)
    elif not math_known:
        zero_centered = _probe(module, LayerNorm if kind == "layernorm" else RMSNorm, shape, eps)
    cls = LayerNorm if kind == "layernorm" else RMSNorm
    weight = module._parameters.get("weight")
    bias = module._parameters.get("bias") if kind == "layernorm" else None
    like = weight if weight is not None else bias if bias is not None else _any_tensor(model)
    new = cls(shape, eps=eps, zero_centered_gamma=zero_centered, params_dtype=like.dtype, device="meta")
    notes = [f"eps={eps:g}"] + (["zero_centered_gamma=True"] if zero_centered else [])
    # Missing affine parameters become constants: the same math, and no new trainable
    # parameters or state_dict keys.
    for name, param, fill in (("weight", weight, 1.0), ("bias", bias, 0.0)):
        if name == "bias" and kind != "layernorm":
            continue
        delattr(new, name)
        if param is not None:
            setattr(new, name, param)
        else:
            new.register_buffer(name, torch.full(shape, fill, dtype=like.dtype, device=like.device), persistent=False)
            notes.append(f"constant {name} {fill:g}")
    return new, f" ({', '.join(notes)})"


def _any_tensor(model: torch.nn.Module) -> torch.Tensor:
    """Somewhere to take device and dtype from for a norm without parameters: the model's first
    floating-point parameter or buffer, else an fp32 CPU tensor."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.dtype.is_floating_point:
            return tensor
    return torch.zeros((), dtype=torch.float32)


def _probe_formula(module: torch.nn.Module, shape: tuple, eps: float) -> Tuple[str, bool]:
    """(kind, zero_centered_gamma) of the te norm that computes what a norm known only by its
    class name computes: RMSNorm first when it has no bias, then LayerNorm."""
    has_bias = module._parameters.get("bias") is not None
    reasons = []
    for kind, cls in ((("layernorm", LayerNorm),) if has_bias else (("rmsnorm", RMSNorm), ("layernorm", LayerNorm))):
        try:
            return kind, _probe(module, cls, shape, eps)
        except _Skip as why:
            reasons.append(str(why))
    raise _Skip("; ".join(reasons))


def _probe(module: torch.nn.Module, cls: type, shape: tuple, eps: float) -> bool:
    """zero_centered_gamma for which cls(shape, eps) computes what `module` computes on a small
    fp32 input (copies of the module, random weights); _Skip when neither form agrees."""
    weight = module._parameters.get("weight")
    device = weight.device if weight is not None else torch.device("cpu")
    if device.type == "meta":
        raise _Skip("its math cannot be checked on the meta device")
    generator = torch.Generator().manual_seed(0)  # the caller's RNG stream stays untouched
    scales = torch.tensor(_PROBE_ROW_SCALES).reshape(-1, *([1] * len(shape)))
    x = (torch.randn(len(_PROBE_ROW_SCALES), *shape, generator=generator) * scales).to(device)
    w = (torch.rand(shape, generator=generator) + 0.5).to(device)  # away from 0 and 1: both forms differ
    b = torch.randn(shape, generator=generator).to(device)
    original = copy.deepcopy(module).float()
    with torch.no_grad():
        if weight is not None:
            original.weight.copy_(w)
        if module._parameters.get("bias") is not None:
            original.bias.copy_(b)
        try:
            expected = original(x)
        except Exception as error:  # any failure means: not a norm we can stand in for
            raise _Skip(f"it failed on a probe input of shape {tuple(x.shape)}: {error}") from error
        if not isinstance(expected, torch.Tensor) or expected.shape != x.shape:
            raise _Skip("its forward does not return one tensor shaped like its input")
        for zero_centered in (False, True):
            candidate = cls(shape, eps=eps, zero_centered_gamma=zero_centered, params_dtype=torch.float32,
                            device=device)
            candidate.weight.copy_(w if weight is not None else torch.full_like(w, 0.0 if zero_centered else 1.0))
            if hasattr(candidate, "bias"):
                candidate.bias.copy_(b if module._parameters.get("bias") is not None else torch.zeros_like(b))
            if torch.allclose(candidate(x), expected.float(), **_PROBE_TOLERANCE):
                return zero_centered
    raise _Skip(f"its output differs from te.{cls.__name__}(eps={eps:g}) with zero_centered_gamma False and True "
                "on a probe input")
