"""Benchmark harness logic: per-round-ratio medians, the result row schema, a tiny real run and
the CLI's argument errors. Fast; no torch.compile."""
import csv
import dataclasses
import json

import pytest
import torch

from transformer_engine.bench import harness, norm_cases
from transformer_engine.bench.__main__ import build_parser

MEASURED = ("p20_ms", "p50_ms", "p80_ms", "gbps", "copy_gbps", "frac_of_copy", "speedup_vs_eager",
            "speedup_vs_compile")
ENV = harness.Environment(device="cpu", isa="avx2", version="0.0", torch=torch.__version__,
                          git_commit="abc1234", allocator="default", threads=1)


def fake_case(providers=("ours", "eager", "compile"), nbytes=10**9, main_bytes=10**9):
    return harness.Case(op="fake", shape=(2, 3), dtype=torch.bfloat16, mode="full", device=torch.device("cpu"),
                        bytes=nbytes, main_bytes=main_bytes, providers={name: (lambda: None) for name in providers})


def test_median_ratio_is_median_of_per_round_ratios():
    eager, ours = [10.0, 1.0, 1.0], [5.0, 1.0, 2.0]
    assert harness.median_ratio(eager, ours) == 1.0  # ratios 2, 1, 0.5
    assert harness.percentile(eager, 50) / harness.percentile(ours, 50) == 0.5  # ratio of medians differs


def test_percentile_interpolates():
    assert harness.percentile([4.0, 1.0, 3.0, 2.0, 5.0], 50) == 3.0
    assert harness.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 20) == pytest.approx(2.0)
    assert harness.percentile([7.0], 80) == 7.0


def test_rotated_order():
    names = ["a", "b", "c"]
    assert [harness.rotated(names, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_row_ratios_on_fabricated_timings():
    # 1 GB moved; copy moves 2 GB (read + write); seconds per round
    times = {"ours": [0.5, 1.0, 2.0], "eager": [1.0, 1.0, 8.0], "compile": [2.0, 0.5, 2.0],
             "copy": [1.0, 0.5, 1.0]}
    row = harness.provider_row(fake_case(), "ours", times, ENV, "now")
    assert row["p50_ms"] == 1000.0
    assert row["speedup_vs_eager"] == 2.0       # ratios 2, 1, 4
    assert row["speedup_vs_compile"] == 1.0     # ratios 4, 0.5, 1
    assert row["gbps"] == 1.0
    assert row["copy_gbps"] == 2.0
    assert row["frac_of_copy"] == 0.25          # (1 GB / t) / (2 GB / copy) per round: 1, 0.25, 0.25
    assert harness.provider_row(fake_case(), "eager", times, ENV, "now")["speedup_vs_eager"] == 1.0


def test_copy_reference_has_a_floor():
    times = {"ours": [1.0], "copy": [1.0]}
    row = harness.provider_row(fake_case(("ours",), main_bytes=1), "ours", times, ENV, "now")
    assert row["copy_gbps"] == 2 * harness.MIN_COPY_BYTES / 1e9
    assert row["speedup_vs_eager"] is None and row["speedup_vs_compile"] is None


def test_rows_written_as_json_and_csv(tmp_path):
    times = {name: [0.001, 0.002] for name in ("ours", "eager", "compile", "copy")}
    rows = [harness.provider_row(fake_case(), name, times, ENV, "now") for name in ("ours", "eager", "compile")]
    json_path, csv_path = harness.write_rows(rows, tmp_path, "fake")
    loaded = json.loads(json_path.read_text())
    assert len(loaded) == 3
    for row in loaded:
        assert set(row) == set(harness.ROW_FIELDS)
        assert all(isinstance(row[field], float) for field in MEASURED)
        assert isinstance(row["threads"], int) and row["allocator"] == "default"
    with open(csv_path, newline="") as f:
        assert [r["provider"] for r in csv.DictReader(f)] == ["ours", "eager", "compile"]
    assert not list(tmp_path.glob("*.tmp"))


def test_geometric_means_over_our_rows(tmp_path):
    rows = [dict(provider="ours", speedup_vs_eager=2.0, speedup_vs_compile=0.5, frac_of_copy=0.5),
            dict(provider="ours", speedup_vs_eager=8.0, speedup_vs_compile=2.0, frac_of_copy=None),
            dict(provider="eager", speedup_vs_eager=1.0, speedup_vs_compile=9.0, frac_of_copy=0.1)]
    means = harness.geometric_means(rows)
    assert means == {"rows": 2, "speedup_vs_eager": pytest.approx(4.0), "speedup_vs_compile": pytest.approx(1.0),
                     "frac_of_copy": pytest.approx(0.5)}
    assert harness.geometric_means(rows[2:]) == {"rows": 0, "speedup_vs_eager": None, "speedup_vs_compile": None,
                                                 "frac_of_copy": None}
    path = harness.write_summary({"fake": means}, tmp_path, "summary")
    assert json.loads(path.read_text())["fake"]["rows"] == 2
    assert "4.00x vs eager" in harness.summary_line(means) and "50% of copy" in harness.summary_line(means)


def test_tiny_layernorm_run():
    case = norm_cases.norm_case("layernorm", (64, 128), torch.float32, "full", torch.device("cpu"))
    case = dataclasses.replace(case, providers={k: v for k, v in case.providers.items() if k != "compile"})
    env = harness.environment(torch.device("cpu"), "default")
    rows = harness.run_case(case, env, rounds=3, warmup=1)
    assert [row["provider"] for row in rows] == ["ours", "eager"]
    for row in rows:
        assert row["shape"] == "64x128" and row["dtype"] == "float32" and row["mode"] == "full"
        assert 0 < row["p20_ms"] <= row["p50_ms"] <= row["p80_ms"]
        assert row["gbps"] > 0 and row["copy_gbps"] > 0 and row["speedup_vs_eager"] > 0
        assert row["speedup_vs_compile"] is None
    assert rows[1]["speedup_vs_eager"] == 1.0
    assert case.bytes == 5 * 64 * 128 * 4


def test_cli_rejects_bad_option():
    with pytest.raises(SystemExit) as excinfo:
        build_parser().parse_args(["--bogus"])
    assert excinfo.value.code == 2


def test_linear_case_providers_all_run():
    from transformer_engine.bench import linear_cases
    case = linear_cases.linear_case((16, 8, 4), torch.float32, torch.device("cpu"))
    assert set(case.providers) == {"ours", "ours_current", "ours_block", "ours_mxfp8", "ours_nvfp4", "ours_hp", "eager",
                                   "compile"}
    assert case.flops == 3 * 2.0 * 16 * 8 * 4
    torch._dynamo.reset()
    for name, run in case.providers.items():
        grads = run()
        assert len(grads) == 3 and grads[0].shape == (16, 8), name


def test_peak_bytes_counts_new_storages_while_they_live():
    x = torch.randn(256, 256)  # 256 KiB, exists before the call: not counted
    assert harness.peak_bytes(lambda: x.view(-1).add_(0)) == 0  # a view and an in-place op create nothing
    assert harness.peak_bytes(lambda: x * 2) == x.nbytes  # one new tensor
    assert harness.peak_bytes(lambda: (x * 2 + 1).sum()) == 2 * x.nbytes  # x*2 and its +1 alive together

    def chain():  # each temporary freed before the next is made: the peak is one tensor
        for _ in range(3):
            y = x * 2
            del y
    assert harness.peak_bytes(chain) == x.nbytes


def test_rows_carry_peak_memory_except_for_compiled_providers():
    x = torch.randn(64, 64)
    case = harness.Case(op="double", shape=(64, 64), dtype=torch.float32, mode="fwd", device=torch.device("cpu"),
                        bytes=2 * x.nbytes, main_bytes=x.nbytes,
                        providers={"ours": lambda: x * 2, "eager": lambda: x + x, "compile": lambda: x * 2})
    rows = {row["provider"]: row for row in harness.run_case(case, ENV, rounds=1, warmup=0)}
    assert rows["ours"]["peak_mb"] == rows["eager"]["peak_mb"] == x.nbytes / 1e6
    assert rows["compile"]["peak_mb"] is None
