"""A tiny real run of every case of the full te-bench suite: each family's sizes are shrunk,
every case is built, every provider runs, and the harness gives rows with the figures that
case promises (GB/s and % of copy for memory-bound ops, TFLOP/s for GEMM steps, tokens/s for
training steps). torch.compile is replaced by the plain function here, so that this checks
our cases and providers, not inductor (whose compile of each case takes seconds)."""
import pytest
import torch

from transformer_engine.bench import (activation_cases, adam_cases, catalog, cross_entropy_cases, fp8_cast_cases,
                                      gpt_cases, harness, layer_cases, linear_cases, norm_cases, rope_cases,
                                      softmax_cases)
from transformer_engine.bench.gpt_model import GPTConfig

CPU = torch.device("cpu")
BF16, FP32 = torch.bfloat16, torch.float32
TINY = {
    activation_cases: dict(HEADLINE=[("gelu", (4, 16), False), ("swiglu", (4, 16), False)],
                           SUITE=[("gelu", (4, 16), False), ("swiglu", (4, 16), False), ("gelu", (4, 16), True)],
                           FP8=[("gelu", (4, 16)), ("swiglu", (4, 16))]),
    adam_cases: dict(HEADLINE=[(16, 1, FP32)], SUITE=[(16, 1, FP32), (16, 1, BF16)]),
    cross_entropy_cases: dict(HEADLINE=[((4, 40), BF16)], SUITE=[((4, 40), BF16), ((3, 33), FP32)]),
    fp8_cast_cases: dict(HEADLINE=[((128, 256), BF16)], SUITE=[((128, 256), BF16), ((64, 96), FP32)]),
    norm_cases: dict(HEADLINE=[((8, 64), BF16)], SUITE=[((8, 64), BF16), ((5, 48), FP32)]),
    rope_cases: dict(HEADLINE=[((8, 2, 2, 16), BF16, "sbhd", False, 16)],
                     SUITE=[((8, 2, 2, 16), BF16, "sbhd", False, 16), ((2, 8, 2, 16), BF16, "bshd", True, 8)]),
    softmax_cases: dict(HEADLINE=[((1, 2, 8, 8), BF16)], SUITE=[((1, 2, 8, 8), BF16), ((1, 1, 4, 24), FP32)]),
    layer_cases: dict(HEADLINE=layer_cases.LlamaConfig(hidden=32, ffn=48, heads=4, groups=2, batch=2, seq=8)),
    linear_cases: dict(SUITE=[((16, 32, 24), FP32)]),
    gpt_cases: dict(HEADLINE=GPTConfig(layers=1, hidden=32, heads=2, groups=2, seq=16, batch=2),
                    QUICK=GPTConfig(layers=1, hidden=32, heads=2, groups=2, seq=8, batch=2)),
}


@pytest.fixture
def tiny_suite(monkeypatch):
    for module, sizes in TINY.items():
        for name, value in sizes.items():
            monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(torch, "compile", lambda model=None, **options: model)
    monkeypatch.setattr(harness, "MIN_COPY_BYTES", 1 << 12)


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_every_case_runs_every_provider(tiny_suite, quick):
    infos = catalog.describe(quick, CPU)
    assert {info.family for info in infos} == set(catalog.FAMILIES) - ({"linear", "layer"} if quick else set())
    env = harness.environment(CPU, "default")
    built = []
    for family, case in catalog.build(infos, quick, CPU):
        rows = harness.run_case(case, env, rounds=1, warmup=0)
        built.append((family, case.op, case.mode))
        assert [row["provider"] for row in rows] == list(case.providers), case.op
        for row in rows:
            label = f"{family} {case.op} {case.mode} {row['provider']}"
            assert row["p50_ms"] > 0, label
            if case.bytes is not None:
                assert row["gbps"] > 0 and row["frac_of_copy"] > 0, label
            if case.flops is not None:
                assert row["tflops"] > 0, label
            if case.tokens is not None:
                assert row["tokens_per_s"] > 0, label
            if "eager" in case.providers:
                assert row["speedup_vs_eager"] > 0, label
    assert len(built) == len(infos)
