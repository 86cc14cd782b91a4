"""The layer table of docs/architecture.md as a contract over every package (in the manner of
import-linter's "layers"): each unit of the package (a subpackage or module of
transformer_engine.pytorch, and transformer_engine's other parts) sits in one layer; it may
import units of the layers below it and none of its own layer or above. Every import counts,
module level and inside functions alike: a deferred import up the table is still an arrow up."""
import ast
import pathlib
from typing import AbstractSet, Dict, Iterator, Optional, Sequence, Tuple

import transformer_engine

ROOT = pathlib.Path(transformer_engine.__file__).parent.parent  # holds transformer_engine/, transformer_engine_torch/
PYTORCH = "transformer_engine.pytorch"
COMPILED = "transformer_engine._kernels"  # the extension setup.py builds: no Python file

# Top to bottom. Names without a dot are units of transformer_engine.pytorch; "pytorch" is its
# __init__ (TE's import surface).
LAYERS: Sequence[Sequence[str]] = (
    ("transformer_engine.bench",),
    ("transformer_engine", "transformer_engine_torch"),
    ("pytorch",),
    # TE's import paths over the layers below, and helpers users call on whole models.
    ("convert", "build_info", "graph", "jit", "cpu_offload", "cross_entropy", "cpp_extensions", "distributed",
     "permutation", "router", "quantized_tensor"),
    ("transformer",),
    ("attention",),
    ("ops",),
    ("module", "optimizers", "moe", "custom_recipes"),
    ("quantization", "checkpointing"),
    ("parallel", "activation_recompute"),
    ("tensor",),
    ("fp8", "rng"),
    ("custom_ops",),
    ("triton",),
    ("reference",),
    # The ground floor: pure functions and constants that every layer may use.
    ("scaling", "dtensor", "utils", "constants", "_autocast", "_extension", "_extra_state", "torch_version",
     "transformer_engine.common", "transformer_engine._version"),
    (COMPILED,),
)


def _module_files() -> Dict[str, pathlib.Path]:
    """Dotted module name -> file, for every Python file of the two packages."""
    files = {}
    for top in ("transformer_engine", "transformer_engine_torch"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def unit_of(module: str) -> str:
    """The layer-table unit a dotted module name belongs to."""
    parts = module.split(".")
    if parts[:2] == ["transformer_engine", "pytorch"]:
        return parts[2] if len(parts) > 2 else "pytorch"
    return ".".join(parts[:2])


def imported_modules(module: str, path: pathlib.Path, modules: AbstractSet[str]) -> Iterator[str]:
    """The dotted names `module` (its file `path`) imports of the two packages: a `from x import
    name` that names a module (one of `modules`) counts as that module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        yield from (t for t in targets if t.split(".")[0] in ("transformer_engine", "transformer_engine_torch"))


def layer_of(unit: str) -> Optional[int]:
    return next((i for i, layer in enumerate(LAYERS) if unit in layer), None)


def violations() -> Tuple[list, list]:
    """(imports that do not run down the table, units the table does not place)."""
    files = _module_files()
    modules = files.keys() | {COMPILED}
    upward, unplaced = [], set()
    for module, path in sorted(files.items()):
        source = unit_of(module)
        for target in imported_modules(module, path, modules):
            destination = unit_of(target)
            if destination == source:
                continue
            here, there = layer_of(source), layer_of(destination)
            unplaced |= {u for u, layer in ((source, here), (destination, there)) if layer is None}
            if here is not None and there is not None and there <= here:
                upward.append(f"{module} imports {target}: layer {there} ({destination}) is not below "
                              f"layer {here} ({source})")
    return upward, sorted(unplaced)


def test_every_import_runs_down_the_layer_table():
    upward, _ = violations()
    assert not upward, "imports against the layer table:\n" + "\n".join(upward)


def test_every_unit_has_a_layer():
    _, unplaced = violations()
    assert not unplaced, f"units missing from LAYERS: {unplaced}"


def test_the_table_names_each_unit_once_and_only_units_that_exist():
    names = [unit for layer in LAYERS for unit in layer]
    assert len(names) == len(set(names))
    existing = {unit_of(module) for module in _module_files()} | {COMPILED}
    assert set(names) - existing == set()


def test_an_import_up_the_table_is_caught(tmp_path):
    """The check itself: a file of the reference layer importing a module fails it."""
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from ..module import linear\n")
    targets = list(imported_modules(f"{PYTORCH}.reference.fake", fake, _module_files().keys()))
    assert targets == [f"{PYTORCH}.module.linear"]
    assert layer_of(unit_of(targets[0])) < layer_of("reference")
