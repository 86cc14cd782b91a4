"""te.make_graphed_callables: TransformerEngine's wrapper of torch.cuda.make_graphed_callables.

A graphed callable computes what the callable computes, inside the te.autocast its arguments
describe (enabled, calibrating, recipe, amax_reduction_group), so that it can be called outside
any autocast region, as TE's captured graphs are.
  * CUDA, high precision: the callables are captured by torch.cuda.make_graphed_callables (its
    warm-up, memory pool and replay), the autocast region entered around each replay.
  * CPU (and any device without graphs): nothing is captured; each call runs the callable in
    that autocast region, so results are those of calling it directly there.
  * FP8 under CUDA-graph capture (TE replays the casts and runs its scale updates between
    replays) is not implemented: refused with NotImplementedError.
Modules come back as themselves, their forward wrapped (their parameters and state_dict are
unchanged); plain functions come back wrapped.
"""
import functools
import warnings
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch

from ..common.recipe import Recipe
from .fp8.context import autocast

_DEPRECATED = {"fp8_enabled": "enabled", "fp8_calibrating": "calibrating", "fp8_recipe": "recipe",
               "fp8_group": "amax_reduction_group", "fp8_weight_caching": "cache_quantized_params"}


def make_graphed_callables(modules, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           sample_kwargs=None, fp8_enabled=None, fp8_calibrating=None, fp8_recipe=None, fp8_group=None,
                           fp8_weight_caching=None, enabled: Union[bool, Sequence[bool], None] = None,
                           calibrating: Optional[bool] = None, recipe: Optional[Recipe] = None,
                           amax_reduction_group=None, cache_quantized_params: Optional[bool] = None,
                           _order=None, _num_layers_per_chunk=None, pool=None, retain_graph_in_backward: bool = False,
                           _reuse_graph_input_output_buffers: bool = False, pre_warmup_hook: Optional[Callable] = None,
                           post_warmup_hook: Optional[Callable] = None):
    """Graphed versions of `modules` (a callable or a tuple of them; sample_args one tuple of
    tensors per callable). enabled (one bool, or one per callable), calibrating, recipe and
    amax_reduction_group: the te.autocast each runs in; the fp8_* names are TE's deprecated
    spellings of the same (warned, refused together with the new ones). cache_quantized_params
    (the is_first_microbatch weight cache: the caller passes is_first_microbatch) and the
    capture options (num_warmup_iters, allow_unused_input, pool, ...) are CUDA graphs' own."""
    given = dict(enabled=enabled, calibrating=calibrating, recipe=recipe, amax_reduction_group=amax_reduction_group,
                 cache_quantized_params=cache_quantized_params)
    deprecated = dict(fp8_enabled=fp8_enabled, fp8_calibrating=fp8_calibrating, fp8_recipe=fp8_recipe,
                      fp8_group=fp8_group, fp8_weight_caching=fp8_weight_caching)
    options = _resolved_options(given, deprecated)
    single = not isinstance(modules, tuple)
    callables = (modules,) if single else tuple(modules)
    args = (sample_args,) if single else tuple(sample_args)
    if len(args) != len(callables):
        raise ValueError(f"make_graphed_callables: {len(callables)} callables but {len(args)} sample_args tuples")
    flags = options["enabled"]
    flags = tuple(flags) if isinstance(flags, (tuple, list)) else (bool(flags),) * len(callables)
    if len(flags) != len(callables):
        raise ValueError(f"make_graphed_callables: enabled has {len(flags)} entries for {len(callables)} callables")
    regions = [functools.partial(autocast, enabled=flag, calibrating=bool(options["calibrating"]),
                                 recipe=options["recipe"], amax_reduction_group=options["amax_reduction_group"])
               for flag in flags]
    if _captures(args):
        if any(flags) or options["calibrating"]:
            raise NotImplementedError("make_graphed_callables: capturing FP8 modules in CUDA graphs is not "
                                      "implemented; call them inside te.autocast without graphs")
        kwargs = (sample_kwargs,) if single and sample_kwargs is not None else sample_kwargs
        graphed = torch.cuda.make_graphed_callables(callables, args, num_warmup_iters=num_warmup_iters,
                                                    allow_unused_input=allow_unused_input, pool=pool,
                                                    sample_kwargs=kwargs)
    else:
        graphed = callables
    wrapped = tuple(_in_region(fn, region) for fn, region in zip(graphed, regions))
    return wrapped[0] if single else wrapped


def _resolved_options(given: Dict[str, Any], deprecated: Dict[str, Any]) -> Dict[str, Any]:
    """The options by their current names, TE's deprecated ones mapped (and warned about)."""
    options = dict(given)
    for old, value in deprecated.items():
        if value is None:
            continue
        new = _DEPRECATED[old]
        if given[new] is not None:
            raise ValueError(f"make_graphed_callables: {old} is the deprecated name of {new}; both were given")
        warnings.warn(f"make_graphed_callables: {old} is deprecated, use {new}", DeprecationWarning, stacklevel=3)
        options[new] = value
    options["enabled"] = False if options["enabled"] is None else options["enabled"]
    return options


def _captures(sample_args: Tuple[tuple, ...]) -> bool:
    """Whether the samples live on a CUDA device (where graphs exist)."""
    tensors = [t for group in sample_args for t in group if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cuda" for t in tensors)


def _in_region(fn: Callable, region: Callable):
    """fn called inside region(); a module is returned itself, its forward wrapped."""
    forward = fn.forward if isinstance(fn, torch.nn.Module) else fn

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with region():
            return forward(*args, **kwargs)
    if isinstance(fn, torch.nn.Module):
        fn.forward = run
        return fn
    return run
