"""te.autocast / te.fp8_autocast: which FP8 recipe modules use, as a stack of immutable contexts.

Entering pushes an Fp8Context; leaving pops it. When the *outermost* region exits, the forward
FP8 states used inside it get their delayed-scaling update (amaxes reduced over the region's
amax_reduction_group first), as in TransformerEngine. Modules never read global flags: they
ask current_context() once per forward and hand its recipe on as a value.

Activation recompute replays a forward in backward (replay.py): recompute_region() puts back
the regions that were open when the forward first ran and, while it is open, schedules no
forward update. This file imports nothing else of fp8/: the FP8 states it updates are anything
with update_forward().
"""
import contextlib
import dataclasses
import threading
import warnings
from typing import Iterator, List, Optional, Protocol, Tuple, Union

from ...common.recipe import DelayedScaling, Recipe


@dataclasses.dataclass(frozen=True)
class Fp8Context:
    """One autocast region. enabled: compute in FP8; calibrating: compute in high precision
    but record amaxes (so scales are ready when FP8 is switched on)."""
    enabled: bool
    calibrating: bool
    recipe: Recipe
    amax_reduction_group: Optional[object] = None

    @property
    def records_amax(self) -> bool:
        return self.enabled or self.calibrating


class UpdatesForward(Protocol):
    """An FP8 state whose forward scales are updated when the outermost region exits
    (fp8.state.Fp8Meta)."""

    def update_forward(self, amax_reduction_group: Optional[object]) -> None: ...


class _Regions(threading.local):
    """Per-thread stack of open regions and the forward updates owed to the outermost one."""

    def __init__(self):
        self.stack: List[Fp8Context] = []
        self.pending_forward_updates: List[UpdatesForward] = []
        self.recompute_depth = 0  # > 0 inside recompute_region()
        self.first_module_pending = False  # see take_first_module_flag()


_regions = _Regions()


def get_default_recipe() -> Recipe:
    """The recipe autocast uses when none is given: DelayedScaling() with TE's defaults."""
    return DelayedScaling()


Availability = Union[bool, Tuple[bool, str]]


def _answer(available: bool, reason: str, return_reason: bool) -> Availability:
    """TransformerEngine's is_*_available answer: a bool, or (bool, reason) when asked."""
    return (available, reason) if return_reason else available


def is_fp8_available(return_reason: bool = False) -> Availability:
    """True everywhere (reason ""): FP8 storage and casts run on the CPU kernels, the Triton
    kernels on GPUs, and the reference ops elsewhere."""
    return _answer(True, "", return_reason)


def is_mxfp8_available(return_reason: bool = False) -> Availability:
    """True everywhere: MXFP8's block casts and GEMMs run wherever FP8 does."""
    return _answer(True, "", return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False) -> Availability:
    """True everywhere: Float8BlockScaling's block casts and GEMMs run wherever FP8 does."""
    return _answer(True, "", return_reason)


def is_nvfp4_available(return_reason: bool = False) -> Availability:
    """True: NVFP4 casts and GEMMs run on every device (exactly on the CPU: fp8/nvfp4_gemm.py)."""
    return _answer(True, "", return_reason)


def is_bf16_available() -> bool:
    return True


def current_context() -> Optional[Fp8Context]:
    """The innermost open region, or None outside every autocast."""
    return _regions.stack[-1] if _regions.stack else None


def defer_forward_update(state: UpdatesForward) -> None:
    """Registers state.update_forward(amax_reduction_group) to run when the outermost region
    exits (once per state, however many forwards used it). The state object is kept rather
    than its bound method: torch.compile can put back a module's attribute after a traced
    forward, but not a bound method made during the trace, which would end the graph there.
    Nothing is registered while a forward is recomputed: its update already ran after the
    original forward."""
    if _regions.recompute_depth:
        return
    if not any(state is pending for pending in _regions.pending_forward_updates):
        _regions.pending_forward_updates.append(state)


def _check_recipe(recipe: Recipe) -> None:
    """Refuses a recipe te.autocast cannot run: a CustomRecipe without its factory."""
    if recipe.custom() and recipe.qfactory is None:
        raise ValueError("autocast: CustomRecipe needs a qfactory (a callable role -> quantizer)")


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Optional[Recipe] = None,
             amax_reduction_group: Optional[object] = None) -> Iterator[None]:
    """FP8 region: modules inside run their GEMMs in FP8 with `recipe` (default
    get_default_recipe()). Regions nest; enabled=False inside switches FP8 off for its body."""
    recipe = get_default_recipe() if recipe is None else recipe
    if not isinstance(recipe, Recipe):
        raise ValueError(f"autocast: recipe must be a transformer_engine.common.recipe recipe, got {recipe!r}")
    if enabled:
        _check_recipe(recipe)
    if not _regions.stack:
        _regions.first_module_pending = bool(enabled)
    _regions.stack.append(Fp8Context(bool(enabled), bool(calibrating), recipe, amax_reduction_group))
    try:
        yield
    finally:
        context = _regions.stack.pop()
        if not _regions.stack and not _regions.recompute_depth:
            pending, _regions.pending_forward_updates = _regions.pending_forward_updates, []
            _run_forward_updates(pending, context.amax_reduction_group)


def _run_forward_updates(states: List[UpdatesForward], amax_reduction_group: Optional[object]) -> None:
    """The forward updates owed at the outermost exit: states of a class that updates many at
    once (update_forwards, as Fp8Meta's joined update, one amax reduction for them all) are
    handed over together; any other state updates alone."""
    by_class: dict = {}
    for state in states:
        by_class.setdefault(type(state), []).append(state)
    for cls, same in by_class.items():
        update_forwards = getattr(cls, "update_forwards", None)
        if update_forwards is not None:
            update_forwards(same, amax_reduction_group)
        else:
            for state in same:
                state.update_forward(amax_reduction_group)


def take_first_module_flag() -> bool:
    """True for the first caller inside an enabled outermost region, False after (what
    TransformerEngine's FP8GlobalStateManager.is_first_fp8_module() reports)."""
    pending, _regions.first_module_pending = _regions.first_module_pending, False
    return pending


def open_regions() -> Tuple[Fp8Context, ...]:
    """The regions open now, outermost first (what recompute_region() later puts back)."""
    return tuple(_regions.stack)


def replace_regions(regions: Tuple[Fp8Context, ...]) -> None:
    """Makes `regions` (an open_regions() snapshot) the open regions, outside any `with`:
    for clients that save and restore the autocast state themselves
    (FP8GlobalStateManager.set_autocast_state)."""
    if not isinstance(regions, (tuple, list)) or not all(isinstance(region, Fp8Context) for region in regions):
        raise ValueError("autocast state must be what get_autocast_state() returned (a tuple of Fp8Context), "
                         f"got {regions!r}")
    _regions.stack = list(regions)


def reset_regions() -> None:
    """Forgets this thread's open regions and the forward updates they owe (for tests and
    clients that recover from an exception raised inside a region they cannot exit)."""
    _regions.stack, _regions.pending_forward_updates = [], []
    _regions.first_module_pending = False


def replaying_a_forward() -> bool:
    """Whether a recompute_region() is open: the forward running is a replay."""
    return _regions.recompute_depth > 0


@contextlib.contextmanager
def recompute_region(regions: Tuple[Fp8Context, ...]) -> Iterator[None]:
    """Runs its body as if `regions` were the open autocast regions (te.checkpoint's replay of
    a forward, usually from a backward outside every autocast); no forward update is scheduled
    or run inside, because the original forward already scheduled its own."""
    outer = _regions.stack
    _regions.stack = list(regions)
    _regions.recompute_depth += 1
    try:
        yield
    finally:
        _regions.recompute_depth -= 1
        _regions.stack = outer


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Optional[Recipe] = None,
                 fp8_group: Optional[object] = None) -> Iterator[None]:
    """TransformerEngine 1.x's spelling of autocast (fp8_recipe -> recipe, fp8_group ->
    amax_reduction_group)."""
    warnings.warn("fp8_autocast is deprecated; use te.autocast(enabled, calibrating, recipe, amax_reduction_group)",
                  DeprecationWarning, stacklevel=3)
    with autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group):
        yield
