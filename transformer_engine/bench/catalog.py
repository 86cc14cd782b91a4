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
from types import ModuleType
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import (activation_cases, adam_cases, attention_cases, cross_entropy_cases, fp8_cast_cases, gemm_cases, gpt_cases,
               layer_cases, linear_cases, norm_cases, overhead_cases, rope_cases, softmax_cases)
from .harness import Case

# Warm-up calls before the timed rounds (the peak-memory call adds one for uncompiled providers;
# a compiled one compiles in its first). The quick suite's rounds keep it under 3 minutes on 2
# cores with a cold torch.compile cache.
ROUNDS, QUICK_ROUNDS, WARMUP = 20, 8, 2
CaseSource = Callable[[bool, torch.device], Iterator[Case]]
# Every family in suite order, by its module: cases(quick, device) builds its cases, and TINY holds
# the sizes tests/bench/test_bench_cases.py shrinks them to. A new family is one entry here.
MODULES: Dict[str, ModuleType] = {
    "norm": norm_cases, "fp8_cast": fp8_cast_cases, "gemm": gemm_cases, "linear": linear_cases,
    "activation": activation_cases,
    "softmax": softmax_cases, "cross_entropy": cross_entropy_cases, "rope": rope_cases,
    "attention": attention_cases, "adam": adam_cases,
    "layer": layer_cases, "gpt": gpt_cases, "overhead": overhead_cases}
FAMILIES: Dict[str, CaseSource] = {family: module.cases for family, module in MODULES.items()}
FAMILY_ROUNDS = {"gemm": gemm_cases.ROUNDS, "linear": linear_cases.ROUNDS, "layer": layer_cases.ROUNDS}


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
