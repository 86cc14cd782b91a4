"""The seams of the FP8 machinery (issue 29): the recipe travels as a value from the autocast
context to the quantizers and is never written into module state during a forward; the FP8
packages import one way (no cycle between fp8/, tensor/ and custom_ops/; inside fp8/, state
knows nothing of regions or replays); a GEMM's FP8 call is an immutable value; and a forward
snapshots scales for a later recompute only where a replay casts with them."""
import ast
import dataclasses
import pathlib

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8.replay import forward_record
from transformer_engine.pytorch.module._fp8_call import Fp8Call

PACKAGE = pathlib.Path(te.__file__).parent

RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
    "block": recipe.Float8BlockScaling,
}

MODULES = {
    "Linear": (lambda: te.Linear(64, 32), lambda m, x: m(x)),
    "LayerNormLinear": (lambda: te.LayerNormLinear(64, 32), lambda m, x: m(x)),
    "LayerNormMLP": (lambda: te.LayerNormMLP(64, 128), lambda m, x: m(x)),
    "GroupedLinear": (lambda: te.GroupedLinear(2, 64, 32), lambda m, x: m(x, [16, 16])),
    "ops.Sequential": (lambda: te.ops.Sequential(te.ops.LayerNorm(64), te.ops.Linear(64, 32)), lambda m, x: m(x)),
}

# The record of the last FP8 forward, kept for torch.utils.checkpoint's recompute, holds the
# autocast regions open then (immutable Fp8Context values, recipe included): what the replay
# re-enters. It is the one place a forward leaves the regions behind.
RECOMPUTE_RECORD = "_fp8_forward_record"


def _imports(path: pathlib.Path):
    """(package of the importing file, imported top-level subpackage of transformer_engine.pytorch)
    for every relative import in `path`, module level and inside functions alike."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            target = list(parts[:len(parts) - node.level]) + (node.module.split(".") if node.module else [])
            names = target[:1] if target else [alias.name for alias in node.names]
            for name in names:
                yield parts[0], name, ".".join(target[1:2]) if len(target) > 1 else ""


def _package_edges():
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        for source, target, _ in _imports(path):
            if source != target:
                edges.add((source, target))
    return edges


def test_no_import_cycle_between_fp8_tensor_and_custom_ops():
    edges = _package_edges()
    packages = ("fp8", "tensor", "custom_ops")
    cycles = [(a, b) for a in packages for b in packages if a < b and (a, b) in edges and (b, a) in edges]
    assert not cycles, f"import cycles between packages: {cycles}"


def test_fp8_imports_one_way():
    """context.py imports nothing else of fp8/; state.py neither context nor replay."""
    def fp8_modules_imported_by(name):
        path = PACKAGE / "fp8" / f"{name}.py"
        tree = ast.parse(path.read_text())
        return {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    assert fp8_modules_imported_by("context") == set()
    assert not fp8_modules_imported_by("state") & {"context", "replay"}


def _references(value, target, path, seen, found):
    """Appends to `found` the attribute path of every reference to `target` reachable from
    `value` through module attributes, containers, named tuples and dataclasses."""
    if value is target:
        found.append(path)
        return
    if id(value) in seen or isinstance(value, (torch.Tensor, str, int, float, bool, type(None))):
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = enumerate(value)
    elif isinstance(value, torch.nn.Module) or dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        if callable(value) and not isinstance(value, torch.nn.Module):
            return
        items = vars(value).items()
    else:
        return
    for key, item in items:
        if isinstance(value, torch.nn.Module) and key in (RECOMPUTE_RECORD, "_modules"):
            continue  # the caller walks each submodule itself
        _references(item, target, f"{path}.{key}", seen, found)


def _module_state(module: torch.nn.Module) -> dict:
    """Every attribute binding of the module tree and its FP8 states: name -> the object bound."""
    state = {}
    for name, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key != RECOMPUTE_RECORD:
                state[f"{name}.{key}"] = value
    return state


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_forward_writes_no_recipe_into_module_state(module_name, recipe_name):
    make, run = MODULES[module_name]
    module = make()
    fp8_recipe = RECIPES[recipe_name]()
    x = torch.randn(32, 64, requires_grad=True)
    with te.autocast(recipe=fp8_recipe):
        run(module, x).sum().backward()
    found = []
    for sub in module.modules():
        _references(sub, fp8_recipe, "", set(), found)
    assert not found, f"{module_name} keeps the recipe object at {found}"
    before = _module_state(module)
    before_values = {key: (value.copy() if isinstance(value, (dict, list)) else value) for key, value in before.items()}
    with te.autocast(recipe=fp8_recipe):
        run(module, x).sum().backward()
    after = _module_state(module)
    assert after.keys() == before.keys()
    rebound = [key for key in before if after[key] is not before[key]
               and not (isinstance(before[key], (frozenset, str, int, float, bool)) and after[key] == before[key])]
    assert not rebound, f"a second forward under the same recipe rebinds {rebound}"
    changed = [key for key, value in before_values.items() if isinstance(value, (dict, list))
               and (len(value) != len(after[key]) or any(a is not b for a, b in zip(
                   value.values() if isinstance(value, dict) else value,
                   after[key].values() if isinstance(value, dict) else after[key])))]
    assert not changed, f"a second forward under the same recipe rewrites {changed}"


def test_state_keeps_a_copy_of_the_recipe():
    """What the caller does to its recipe object later never reaches the state; a forward under
    a recipe of another value records that value."""
    fp8_recipe = recipe.DelayedScaling(margin=0)
    layer = te.Linear(16, 16)
    with te.autocast(recipe=fp8_recipe):
        layer(torch.randn(4, 16))
    assert layer.fp8_meta.made_for == fp8_recipe and layer.fp8_meta.made_for is not fp8_recipe
    fp8_recipe.margin = 2
    assert layer.fp8_meta.made_for.margin == 0
    with te.autocast(recipe=fp8_recipe):
        layer(torch.randn(4, 16))
    assert layer.fp8_meta.made_for.margin == 2


def test_fp8_call_is_a_value():
    layer = te.Linear(16, 16)
    with te.autocast(recipe=recipe.DelayedScaling()):
        call = layer._fp8_call(layer._fp8_context(), layer.weight, None, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.input_fp8 = None
    moved = dataclasses.replace(call, needs_backward=False)
    assert call.needs_backward and not moved.needs_backward and moved.quantizers is call.quantizers
    assert isinstance(call, Fp8Call)


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_scales_kept_for_a_recompute_only_where_a_replay_reads_them(recipe_name):
    layer = te.Linear(16, 16)
    with te.autocast(recipe=RECIPES[recipe_name]()):
        layer(torch.randn(4, 16, requires_grad=True))
        record = forward_record(layer.fp8_meta)
        scale = layer.fp8_meta.scaling_fwd.scale
        assert record.meta is layer.fp8_meta
        if recipe_name == "delayed":
            assert torch.equal(record.scales["scale"], scale) and record.scales["scale"] is not scale
        else:  # the casts derive each scale from the tensor: a replay of the same tensors finds it again
            assert record.scales is None


def test_no_recompute_record_under_inference_mode():
    layer = te.Linear(16, 16)
    with torch.inference_mode(), te.autocast(recipe=recipe.DelayedScaling()):
        layer(torch.randn(4, 16))
    assert layer._fp8_forward_record is None


_ASKED = []


def _counting_factory(role):
    _ASKED.append(role)
    return te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)


def test_custom_recipe_answers_survive_deepcopy_and_pickle():
    """The answers name their recipe object by a weak reference, which a copy of the module
    drops: the copy asks the factory again on its next forward; the module pickles."""
    import copy
    import io

    rec = recipe.CustomRecipe(qfactory=_counting_factory)
    layer = te.Linear(16, 16)
    _ASKED.clear()
    with te.autocast(recipe=rec):
        layer(torch.randn(4, 16))
    asked_once = len(_ASKED)
    twin = copy.deepcopy(layer)
    torch.save(layer, io.BytesIO())
    with te.autocast(recipe=rec):
        layer(torch.randn(4, 16))
        assert len(_ASKED) == asked_once  # the same module and recipe object: not asked again
        twin(torch.randn(4, 16))
    assert len(_ASKED) == 2 * asked_once
