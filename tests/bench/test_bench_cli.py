"""te-bench: argument parsing and errors, listing, a tiny real run of fabricated cases (JSON and
CSV schema, filters, progress), --compare and the regression gate, plot data. No real benchmark
runs: the families are replaced by a fabricated one over tiny tensors."""
import csv
import io
import json
from pathlib import Path

import pytest
import torch

from transformer_engine.bench import catalog, cli, compare, harness, plot, progress, report
from transformer_engine.bench.__main__ import build_parser as main_module_parser

ROOT = Path(__file__).resolve().parents[2]
ENV_FIELDS = {"device": str, "device_name": str, "isa": str, "version": str, "torch": str, "python": str,
              "platform": str, "git_commit": str, "timestamp": str, "allocator": str, "threads": int, "quick": bool,
              "command": list, "peaks": type(None)}  # peaks: None on the CPU
built = []  # (op, mode) of every fabricated case built on a real (not fake) tensor


def fake_case(op, shape, dtype, mode, device):
    x = torch.ones(shape, dtype=dtype, device=device)
    if not isinstance(x, torch._subclasses.fake_tensor.FakeTensor):
        built.append((op, mode))
    nbytes = x.numel() * x.element_size()
    return harness.Case(op=op, shape=shape, dtype=dtype, mode=mode, device=device, bytes=2 * nbytes,
                        main_bytes=nbytes, flops=float(x.numel()),
                        providers={"ours": lambda: x * 2, "eager": lambda: x + x, "compile": lambda: x.mul(2)})


def scale_cases(quick, device):
    """Quick: scale 4x8 fp32 fwd and full. Full suite adds scale 3x5 bf16 fwd."""
    for mode in ("fwd", "full"):
        yield fake_case("scale", (4, 8), torch.float32, mode, device)
    if not quick:
        yield fake_case("scale", (3, 5), torch.bfloat16, "fwd", device)


def shift_cases(quick, device):
    yield fake_case("shift", (2, 3, 4), torch.float32, "fwd", device)


@pytest.fixture(autouse=True)
def fabricated_suite(monkeypatch):
    monkeypatch.setattr(catalog, "FAMILIES", {"scale": scale_cases, "shift": shift_cases})
    monkeypatch.setattr(harness, "MIN_COPY_BYTES", 1 << 12)  # the copy reference: 4 KiB, not 64 MiB
    monkeypatch.setattr(harness, "configure_allocator", lambda: "default")  # leave this process's malloc alone
    built.clear()


def run_main(capsys, argv, **kwargs):
    code = cli.main(argv, **kwargs)
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out):
    """(op, shape, dtype, mode, provider) of each table line printed."""
    lines = out.splitlines()
    start = lines.index(harness.table_header()) + 1
    end = lines.index("", start)
    return [tuple(line.split()[:5]) for line in lines[start:end]]


def test_parser_defaults():
    args = cli.build_parser().parse_args(["run"])
    assert (args.op, args.family, args.dtype, args.shape, args.mode, args.providers) == ([], [], [], [], [], [])
    assert not args.quick and args.device is None and args.rounds is None
    assert args.json is args.csv is args.plot is args.out is args.compare is args.fail_if_regression is None
    plain = cli.build_parser().parse_args([])
    assert plain.command is None and not plain.suite_quick and plain.suite_out == Path("benchmarks/results")
    legacy = main_module_parser().parse_args(["--quick", "--out", "x"])
    assert legacy.suite_quick and legacy.suite_out == Path("x")


def test_parser_every_option():
    args = cli.build_parser().parse_args(
        ["run", "--op", "a", "b", "--op", "c", "--family", "scale", "--dtype", "bf16", "FP32", "--dtype", "float16",
         "--shape", "8192X4096", "08x2", "--mode", "fwd", "full", "--providers", "ours, eager", "--device", "cpu",
         "--rounds", "3", "--quick", "--json", "r.json", "--csv", "r.csv", "--plot", "r.png", "--out", "d",
         "--compare", "old.json", "--fail-if-regression", "2.5"])
    assert args.op == ["a", "b", "c"] and args.family == ["scale"]
    assert args.dtype == ["bfloat16", "float32", "float16"] and args.shape == ["8192x4096", "8x2"]
    assert args.mode == ["fwd", "full"] and args.providers == ["ours", "eager"] and args.device == "cpu"
    assert args.rounds == 3 and args.quick and args.fail_if_regression == 2.5
    assert (args.json, args.csv, args.plot, args.out, args.compare) == (
        Path("r.json"), Path("r.csv"), Path("r.png"), Path("d"), Path("old.json"))


@pytest.mark.parametrize("argv, words", [
    (["--bogus"], "--bogus"),
    (["run", "--family", "nope"], "nope"),
    (["run", "--op", "nope"], "unknown op nope"),
    (["list", "--shape", "8192*4096"], "bad shape"),
    (["run", "--shape", "x4"], "bad shape"),
    (["run", "--dtype", "int3"], "unknown dtype"),
    (["run", "--mode", "sideways"], "sideways"),
    (["run", "--rounds", "0"], "positive integer"),
    (["run", "--providers", "ours,nope"], "unknown provider nope"),
    (["run", "--providers", ","], "provider names"),
    (["run", "--device", "musa"], "no MUSA device"),
    (["run", "--device", "tpu"], "tpu"),
    (["run", "--compare", "/nonexistent/old.json"], "does not exist"),
    (["run", "--fail-if-regression", "5"], "needs --compare"),
    (["run", "--compare", "old.json", "--fail-if-regression", "-1"], "percentage"),
    (["run", "--shape", "9x9"], "no case"),
    (["run", "--quick", "--dtype", "bf16"], "no case of the quick suite"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, words):
    code, out, err = run_main(capsys, argv)
    assert code == 2
    assert out == "" and err.count("\n") == 1 and err.startswith("te-bench") and ": error: " in err and words in err, err
    assert not built


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_cuda_exit_2(capsys):
    code, _, err = run_main(capsys, ["list", "--device", "cuda"])
    assert code == 2 and err == "te-bench: error: --device cuda: no CUDA device is available\n"


def test_bad_compare_file_exit_2(capsys, tmp_path):
    for text, words in (("not json", "cannot read"), ('{"schema": 99, "rows": []}', "schema 99"),
                        ('[{"op": "scale"}]', "no list of rows")):
        path = tmp_path / "old.json"
        path.write_text(text)
        code, _, err = run_main(capsys, ["run", "--compare", str(path)])
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_list_shows_every_case_and_builds_none(capsys):
    code, out, err = run_main(capsys, ["list", "--device", "cpu"])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["family", "op", "shape", "dtype", "mode", "providers"]
    assert [line.split() for line in lines[1:-1]] == [
        ["scale", "scale", "4x8", "float32", "fwd", "ours,eager,compile"],
        ["scale", "scale", "4x8", "float32", "full", "ours,eager,compile"],
        ["scale", "scale", "3x5", "bfloat16", "fwd", "ours,eager,compile"],
        ["shift", "shift", "2x3x4", "float32", "fwd", "ours,eager,compile"]]
    assert lines[-1] == "4 cases"
    assert not built  # described under FakeTensorMode: no real tensor made
    code, out, _ = run_main(capsys, ["list", "--quick", "--mode", "full", "fwd", "--family", "scale"])
    assert code == 0 and out.splitlines()[-1] == "2 cases"
    code, out, _ = run_main(capsys, ["list", "--dtype", "bf16", "--shape", "3x5"])
    assert code == 0 and out.splitlines()[-1] == "1 cases" and "3x5" in out


def test_list_of_the_real_quick_suite_allocates_nothing(monkeypatch):
    monkeypatch.undo()  # the real families
    infos = catalog.describe(True, torch.device("cpu"))
    assert {info.family for info in infos} >= {"norm", "fp8_cast", "activation", "softmax", "rope", "adam"}
    assert ("layernorm", "8192x4096", "bfloat16", "full") in {(i.op, i.shape, i.dtype, i.mode) for i in infos}
    assert all(info.providers[0] == "ours" and "eager" in info.providers for info in infos)


def test_run_writes_json_and_csv_schema(capsys, tmp_path):
    json_path, csv_path = tmp_path / "r" / "run.json", tmp_path / "run.csv"
    argv = ["run", "--device", "cpu", "--rounds", "2", "--json", str(json_path), "--csv", str(csv_path)]
    code, out, _ = run_main(capsys, argv)
    assert code == 0
    expected = [(op, shape, dtype, mode, provider)
                for op, shape, dtype, mode in [("scale", "4x8", "float32", "fwd"), ("scale", "4x8", "float32", "full"),
                                               ("scale", "3x5", "bfloat16", "fwd"), ("shift", "2x3x4", "float32", "fwd")]
                for provider in ("ours", "eager", "compile")]
    assert table_rows(out) == expected
    document = json.loads(json_path.read_text())
    assert set(document) == {"schema", "environment", "rows"} and document["schema"] == report.SCHEMA == 1
    environment = document["environment"]
    assert set(environment) == set(ENV_FIELDS)
    assert all(isinstance(environment[field], kind) for field, kind in ENV_FIELDS.items())
    assert environment["device"] == "cpu" and environment["command"] == ["te-bench", *argv]
    rows = document["rows"]
    assert [tuple(row[f] for f in report.KEY_FIELDS) for row in rows] == expected
    for row in rows:
        assert list(row) == list(harness.ROW_FIELDS)
        assert all(isinstance(row[f], float) and row[f] > 0 for f in
                   ("p20_ms", "p50_ms", "p80_ms", "gbps", "tflops", "copy_gbps", "frac_of_copy",
                    "speedup_vs_eager", "speedup_vs_compile"))
        assert row["p20_ms"] <= row["p50_ms"] <= row["p80_ms"] and row["saved_mb"] is None
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == harness.ROW_FIELDS
        assert [(r["op"], r["shape"], r["dtype"], r["mode"], r["provider"]) for r in reader] == expected
    assert report.load_rows(json_path) == rows


def test_filters_build_only_the_selected_cases(capsys):
    code, out, _ = run_main(capsys, ["run", "--device", "cpu", "--rounds", "1", "--family", "scale", "--mode", "fwd",
                                     "--providers", "ours,eager"])
    assert code == 0
    assert table_rows(out) == [("scale", "4x8", "float32", "fwd", "ours"), ("scale", "4x8", "float32", "fwd", "eager"),
                               ("scale", "3x5", "bfloat16", "fwd", "ours"), ("scale", "3x5", "bfloat16", "fwd", "eager")]
    assert built == [("scale", "fwd"), ("scale", "full"), ("scale", "fwd")]  # shift's generator never started
    built.clear()
    code, out, _ = run_main(capsys, ["run", "--device", "cpu", "--rounds", "1", "--op", "scale", "--quick",
                                     "--mode", "fwd", "--providers", "ours"])
    assert code == 0 and built == [("scale", "fwd")]  # stopped after the last selected case
    row = table_rows(out)
    assert row == [("scale", "4x8", "float32", "fwd", "ours")]
    line = [line for line in out.splitlines() if line.startswith("scale ")][0]
    assert line.split()[-5:-3] == ["-", "-"]  # no eager or compile row: no speedups


def test_plain_command_runs_the_quick_suite_into_out(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "matplotlib_available", lambda: False)  # the plot has its own test
    code, out, _ = run_main(capsys, ["--out", str(tmp_path)])
    assert code == 0
    assert {row[0] + row[3] for row in table_rows(out)} == {"scalefwd", "scalefull", "shiftfwd"}  # quick: no 3x5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quick_cpu.csv", "quick_cpu.json"]
    document = json.loads((tmp_path / "quick_cpu.json").read_text())
    assert document["environment"]["quick"] and len(document["rows"]) == 9  # 3 cases x 3 providers
    assert "no plot: matplotlib is not installed" in out


def test_full_suite_writes_each_family_as_it_ends(capsys, tmp_path, monkeypatch):
    written = []
    real_write_rows = harness.write_rows

    def spy(rows, out_dir, stem):
        written.append((stem, len(built)))  # how many cases had been built when the file was written
        return real_write_rows(rows, out_dir, stem)
    monkeypatch.setattr(harness, "write_rows", spy)
    code, out, _ = run_main(capsys, ["--out", str(tmp_path)], prog="python -m transformer_engine.bench",
                            default_quick=False)
    assert code == 0 and ("scale", "3x5", "bfloat16", "fwd", "ours") in table_rows(out)
    assert written == [("scale_cpu", 3), ("shift_cpu", 4)]  # scale's file before shift's case was built
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "scale_cpu.csv", "scale_cpu.json", "shift_cpu.csv", "shift_cpu.json", "summary_cpu.json"]
    assert set(json.loads((tmp_path / "summary_cpu.json").read_text())) == {"scale", "shift", "all"}


def rows_like(rows, p50_ms):
    return [dict(row, p50_ms=p50_ms) for row in rows]


def test_compare_and_regression_gate(capsys, tmp_path):
    new_path = tmp_path / "new.json"
    assert cli.main(["run", "--device", "cpu", "--rounds", "1", "--op", "shift", "--json", str(new_path)]) == 0
    rows = report.load_rows(new_path)
    capsys.readouterr()
    old_path = tmp_path / "old.json"
    argv = ["run", "--device", "cpu", "--rounds", "1", "--op", "shift", "scale", "--quick", "--compare", str(old_path),
            "--fail-if-regression", "10"]
    report.write_json(old_path, {}, rows_like(rows, 1e9))  # everything was far slower before
    code, out, err = run_main(capsys, argv)
    assert code == 0 and "REGRESSION" not in out
    comparison = out[out.index("compared with"):].splitlines()
    assert comparison[1].split()[:5] == ["op", "shape", "dtype", "mode", "provider"]
    assert [line.split()[:5] for line in comparison[2:5]] == [["shift", "2x3x4", "float32", "fwd", p]
                                                              for p in ("ours", "eager", "compile")]
    assert comparison[-1] == "6 rows have no earlier counterpart"  # the scale rows
    report.write_json(old_path, {}, rows_like(rows, 1e-9))  # everything was far faster before
    code, out, err = run_main(capsys, argv)
    assert code == 1 and out.count("REGRESSION") == 1  # ours; eager and compile rows never fail the gate
    assert err.splitlines()[-1] == "1 of our rows are more than 10% slower"
    old_path.write_text(json.dumps(rows_like(rows, 1e-9)))  # the bare row list of --out files
    code, out, _ = run_main(capsys, argv[:-2])  # without the gate: ratios only, exit 0
    assert code == 0 and "REGRESSION" not in out and "compared with" in out


def test_regressions_on_fabricated_rows():
    def row(provider, p50_ms, op="scale"):
        return dict(op=op, shape="4x8", dtype="float32", mode="fwd", provider=provider, p50_ms=p50_ms)
    old = [row("ours", 10.0), row("ours_hp", 10.0), row("eager", 10.0), row("ours", 1.0, op="gone")]
    equal = compare.compare(old, old[:3])
    assert [c.ratio for c in equal.changes] == [1.0, 1.0, 1.0] and compare.regressions(equal, 0.0) == []
    assert equal.only_old == [("gone", "4x8", "float32", "fwd", "ours")] and equal.only_new == []
    slower = compare.compare(old, [row("ours", 10.5), row("ours_hp", 10.6), row("eager", 50.0), row("ours", 1.0, "new")])
    assert [c.key[-1] for c in compare.regressions(slower, 5.0)] == ["ours_hp"]  # 5% exactly passes
    lines = compare.format_comparison(slower, 5.0)
    assert lines[2].endswith("1.06x    +6.0%  REGRESSION") and lines[1].endswith("1.05x    +5.0%")
    assert lines[-2:] == ["1 rows have no earlier counterpart", "1 earlier rows were not run this time"]


def test_progress_goes_to_stderr_and_leaves_the_table_alone(capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    code, out, err = run_main(capsys, ["run", "--device", "cpu", "--rounds", "1", "--quick"])
    assert code == 0
    assert err.splitlines() == ["[0/3] 0 s  running scale 4x8 float32 fwd", "[1/3] 0 s  running scale 4x8 float32 full",
                                "[2/3] 0 s  running shift 2x3x4 float32 fwd"]
    assert "running" not in out and len(table_rows(out)) == 9


def test_progress_in_place_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    stream = Terminal()
    bar = progress.Progress(2, stream)
    bar.show(0, "a")
    bar.show(1, "bb")
    bar.clear()
    first, second = "[0/2] 0 s  running a", "[1/2] 0 s  running bb"
    assert stream.getvalue() == ("\r" + first + "\r" + " " * len(first) + "\r" + "\r" + second
                                 + "\r" + " " * len(second) + "\r")
    quiet = Terminal()
    monkeypatch.setattr(progress, "DELAY_S", 60.0)
    progress.Progress(2, quiet).show(0, "a")
    assert quiet.getvalue() == ""  # short runs show nothing


def test_plot_data_from_rows():
    def row(op, provider, gbps, eager, comp, copy):
        return dict(op=op, shape="4x8", dtype="float32", mode="fwd", provider=provider, gbps=gbps,
                    speedup_vs_eager=eager, speedup_vs_compile=comp, copy_gbps=copy)
    rows = [row("a", "ours", 10.0, 2.0, 1.5, 20.0), row("a", "eager", 5.0, 1.0, 0.7, 22.0),
            row("b", "ours", None, 3.0, None, 30.0)]
    data = plot.plot_data(rows)
    assert data["labels"] == ["a 4x8 float32 fwd", "b 4x8 float32 fwd"]
    assert data["gbps"] == {"ours": [10.0, None], "eager": [5.0, None]} and data["copy_gbps"] == 22.0
    assert data["speedups"] == {"vs eager": [2.0, 3.0], "vs compile": [1.5, None]}


def test_plot_file_or_one_line_error(capsys, monkeypatch, tmp_path):
    path = tmp_path / "plot.png"
    argv = ["run", "--device", "cpu", "--rounds", "1", "--quick", "--op", "shift", "--plot", str(path)]
    find_spec = plot.importlib.util.find_spec
    monkeypatch.setattr(plot.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib"
                        else find_spec(name, *a))
    code, out, err = run_main(capsys, argv)
    assert code == 2 and out == "" and err == ("te-bench: error: --plot needs matplotlib, which is not installed "
                                               "(pip install matplotlib)\n")
    monkeypatch.undo()
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(catalog, "FAMILIES", {"shift": shift_cases})
    monkeypatch.setattr(harness, "MIN_COPY_BYTES", 1 << 12)
    monkeypatch.setattr(harness, "configure_allocator", lambda: "default")
    assert cli.main(argv) == 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_script_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["te-bench"].partition(":")
    assert module == "transformer_engine.bench.cli" and getattr(cli, function) is cli.main
