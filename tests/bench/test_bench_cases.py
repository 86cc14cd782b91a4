"""A tiny real run of every case of the full te-bench suite: each family's sizes are shrunk to the
TINY its module declares, every case is built, every provider runs, and the harness gives rows
with the figures that case promises (GB/s and % of copy for memory-bound ops, TFLOP/s for GEMM
steps, tokens/s for training steps). torch.compile is replaced by the plain function here, so that this checks
our cases and providers, not inductor (whose compile of each case takes seconds)."""
import pytest
import torch

from transformer_engine.bench import catalog, harness

CPU = torch.device("cpu")


@pytest.fixture
def tiny_suite(monkeypatch):
    for module in catalog.MODULES.values():  # each family's own tiny sizes (its TINY)
        for name, value in module.TINY.items():
            monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(torch, "compile", lambda model=None, **options: model)
    monkeypatch.setattr(harness, "MIN_COPY_BYTES", 1 << 12)


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_every_case_runs_every_provider(tiny_suite, quick):
    infos = catalog.describe(quick, CPU)
    left_out = {"gemm", "linear", "layer", "decode"} if quick else set()
    assert {info.family for info in infos} == set(catalog.FAMILIES) - left_out
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
