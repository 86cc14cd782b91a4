"""The benchmark families, cheap descriptions of their cases, and filtered building.

Every family module exposes cases(quick, device), a generator that builds (allocates) each Case
when iteration reaches it. describe() lists the cases without allocating: it runs the
generators under FakeTensorMode (tensors carry shape, dtype and device but no storage) with
torch.compile replaced by the identity, so nothing is compiled either; no provider is ever
called there. select() filters the descriptions; build() then walks the real generators of the
selected families only, and stops each one after its last selected case, so cases after it are
never built.
"""
import dataclasses
import importlib
import os
import pkgutil
from types import ModuleType
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .harness import Case

# Warm-up calls before the timed rounds (the peak-memory call adds one for uncompiled providers;
# a compiled one compiles in its first). The quick suite's rounds keep it under 3 minutes on 2
# cores with a cold torch.compile cache.
ROUNDS, QUICK_ROUNDS, WARMUP = 20, 8, 2
CaseSource = Callable[[bool, torch.device], Iterator[Case]]
# The families above single ops, in suite order after the op families: one module, a layer, a
# decoding step, a model's training step, per-call overhead.
STEP_FAMILIES = ("linear", "layer", "decode", "gpt", "overhead")


def _family_modules() -> Dict[str, ModuleType]:
    """Every family by its module <family>_cases.py, found by name in this package: the op
    families in alphabetical order, then STEP_FAMILIES. A family module's cases(quick, device)
    builds its cases, its TINY holds the sizes tests/bench/test_bench_cases.py shrinks them to,
    and its ROUNDS, where set, the default rounds of the full suite. A new op family is its
    module alone."""
    found = sorted(name.removesuffix("_cases") for _, name, _ in pkgutil.iter_modules([os.path.dirname(__file__)])
                   if name.endswith("_cases"))
    order = [family for family in found if family not in STEP_FAMILIES] + list(STEP_FAMILIES)
    return {family: importlib.import_module(f".{family}_cases", __package__) for family in order}


MODULES = _family_modules()
FAMILIES: Dict[str, CaseSource] = {family: module.cases for family, module in MODULES.items()}
FAMILY_ROUNDS = {family: module.ROUNDS for family, module in MODULES.items() if hasattr(module, "ROUNDS")}


def family_rounds(family: str, quick: bool) -> int:
    """Default rounds of a family: fewer for the quick suite and for the seconds-long steps."""
    return QUICK_ROUNDS if quick else FAMILY_ROUNDS.get(family, ROUNDS)


@dataclasses.dataclass(frozen=True)
class CaseInfo:
    """What a Case is, without its tensors. shape: "8192x4096"; dtype: "bfloat16"."""
    family: str
    op: str
    shape: str
    dtype: str
    mode: str
    providers: Tuple[str, ...]

    @property
    def key(self) -> Tuple[str, str, str, str, str]:
        """Identifies the case within a suite; providers are left out because some depend on
        what the device supports (adam_cases adds torch_fused where it runs)."""
        return self.family, self.op, self.shape, self.dtype, self.mode


def info_of(family: str, case: Case) -> CaseInfo:
    return CaseInfo(family=family, op=case.op, shape=shape_text(case.shape), dtype=dtype_text(case.dtype),
                    mode=case.mode, providers=tuple(case.providers))


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


def dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(quick: bool, device: torch.device, families: Optional[Sequence[str]] = None,
             sources: Optional[Dict[str, CaseSource]] = None) -> List[CaseInfo]:
    """CaseInfo of every case of `families` (default: all) in suite order, allocating no tensor
    storage and compiling nothing. The real `device` is passed on because some families pick
    their dtype by device (layer_cases.step_dtype: fp32 on CPUs without bf16 matrix units)."""
    sources = FAMILIES if sources is None else sources
    infos = []
    # The providers built here are closures over fake tensors; they are dropped unused.
    with mock.patch.object(torch, "compile", _no_compile), FakeTensorMode(allow_non_fake_inputs=True):
        for family in families or list(sources):
            infos += [info_of(family, case) for case in sources[family](quick, device)]
    return infos


def _no_compile(model=None, **_options):
    return model


@dataclasses.dataclass(frozen=True)
class Filters:
    """Empty tuple = no restriction. dtypes as dtype_text gives them, shapes as shape_text."""
    ops: Tuple[str, ...] = ()
    families: Tuple[str, ...] = ()
    dtypes: Tuple[str, ...] = ()
    shapes: Tuple[str, ...] = ()
    modes: Tuple[str, ...] = ()

    def accepts(self, info: CaseInfo) -> bool:
        checks = ((self.ops, info.op), (self.families, info.family), (self.dtypes, info.dtype),
                  (self.shapes, info.shape), (self.modes, info.mode))
        return all(not allowed or value in allowed for allowed, value in checks)


def select(infos: Sequence[CaseInfo], filters: Filters) -> List[CaseInfo]:
    return [info for info in infos if filters.accepts(info)]


def build(selected: Sequence[CaseInfo], quick: bool, device: torch.device,
          sources: Optional[Dict[str, CaseSource]] = None) -> Iterator[Tuple[str, Case]]:
    """(family, Case) for each selected description, built on `device` in suite order.

    A family's generator is only started when it has a selected case, and closed after the
    last one; cases before that which are not selected are built (the generators offer no
    way to skip them) and dropped at once."""
    sources = FAMILIES if sources is None else sources
    wanted: Dict[str, List[Tuple[str, ...]]] = {}
    for info in selected:
        wanted.setdefault(info.family, []).append(info.key)
    for family, remaining in wanted.items():
        generator = iter(sources[family](quick, device))
        try:
            for case in generator:
                key = info_of(family, case).key
                if key in remaining:
                    remaining.remove(key)
                    yield family, case
                del case  # an unselected case's tensors are freed before the next is built
                if not remaining:
                    break
        finally:
            getattr(generator, "close", lambda: None)()


def with_providers(case: Case, providers: Sequence[str]) -> Case:
    """The case restricted to `providers` (those it has, in its own order); all when empty."""
    if not providers:
        return case
    kept = {name: fn for name, fn in case.providers.items() if name in providers}
    return dataclasses.replace(case, providers=kept,
                               saved_bytes_of=tuple(n for n in case.saved_bytes_of if n in kept))
