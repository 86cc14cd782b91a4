"""te-bench: list and run the benchmark cases, write and compare results.

    te-bench [--out DIR]           the quick suite (as `make bench`): the table, and DIR/quick_<device>
                                   .json/.csv/.png (DIR default benchmarks/results; .png with matplotlib)
    te-bench list [filters]        every case: family, op, shape, dtype, mode, providers
    te-bench run [filters] [--providers ours,eager,compile] [--device cpu|cuda|musa] [--rounds N]
                 [--json FILE] [--csv FILE] [--plot FILE.png] [--out DIR]
                 [--compare OLD.json [--fail-if-regression PCT]]
    filters: --op NAME.. --family NAME.. --dtype bf16.. --shape 8192x4096.. --mode fwd|bwd|full|step.. --quick
    te-bench train [--steps N] [--layers L] [--hidden H] [--heads A] [--seq S] [--batch B] [--lr LR]
                   [--variants ours,ours_fp8,eager,compile] [--device ...] [--json FILE] [--plot FILE.png]
                                   a small GPT trained per variant: loss curves, tokens/s, memory

    te-bench parallel [--tp 2] [--hidden H] [--ffn F] [--heads A] [--seq S] [--batch B] [--steps N]
                      [--no-sequence-parallel] [--dtype bf16] [--device cpu] [--json FILE]
                                   one tensor-parallel TransformerLayer step on --tp processes:
                                   compute, exposed and standalone communication, overlap

`python -m transformer_engine.bench [--quick] [--out DIR]`: without a subcommand the full suite
(unless --quick), writing DIR/<family>_<device>.json/.csv as each family ends and
DIR/summary_<device>.json at the end.

Exit status: 0 done; 1 --fail-if-regression found our rows slower than allowed; 2 bad
arguments (one line on stderr).
"""
import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from transformer_engine.pytorch import default_device

from . import catalog, compare, gpt, gpt_report, harness, parallel, plot, report
from .gpt_model import GPTConfig
from .progress import Progress

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "half": "float16", "float16": "float16",
          "fp32": "float32", "float": "float32", "float32": "float32"}
MODES = ("fwd", "fwd_grad", "bwd", "full", "step")
DEVICES = ("cpu", "cuda", "musa")
DEFAULT_OUT = Path("benchmarks/results")
_SHAPE = re.compile(r"\d+(x\d+)*")


class UsageError(Exception):
    """Bad arguments: reported as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage block) and exits with 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _dtype(text: str) -> str:
    if text.lower() not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r} (known: {', '.join(DTYPES)})")
    return DTYPES[text.lower()]


def _shape(text: str) -> str:
    """'8192x4096' -> '8192x4096' (sizes as plain integers, how rows spell shapes)."""
    if not _SHAPE.fullmatch(text.strip().lower()):
        raise argparse.ArgumentTypeError(f"bad shape {text!r} (expected sizes joined by x, e.g. 8192x4096)")
    return "x".join(str(int(size)) for size in text.strip().lower().split("x"))


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}")
    return value


def _providers(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected provider names separated by commas, e.g. ours,eager")
    return names


def _variants(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in gpt.VARIANTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected variants from {', '.join(gpt.VARIANTS)} separated by commas, "
                                         f"got {text!r}")
    return list(dict.fromkeys(names))


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser(prog: str = "te-bench") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Benchmark our fused ops against PyTorch eager and torch.compile. "
                                            "Without a subcommand: run the quick suite (te-bench) or the full one "
                                            "(python -m transformer_engine.bench) and write the results in --out.")
    parser.add_argument("--quick", dest="suite_quick", action="store_true",
                        help="without a subcommand: the quick suite ([8192, 4096] bf16 and the like, "
                             f"{catalog.QUICK_ROUNDS} rounds; te-bench alone always runs it)")
    parser.add_argument("--out", dest="suite_out", type=Path, default=DEFAULT_OUT,
                        help=f"without a subcommand: directory for the results (default: {DEFAULT_OUT})")
    commands = parser.add_subparsers(dest="command", metavar="{list,run,train,parallel}")

    filters = _Parser(add_help=False)
    filters.add_argument("--op", nargs="+", action="extend", default=[], metavar="NAME", help="only these ops")
    filters.add_argument("--family", nargs="+", action="extend", default=[], choices=list(catalog.FAMILIES),
                         metavar="NAME", help=f"only these families ({', '.join(catalog.FAMILIES)})")
    filters.add_argument("--dtype", nargs="+", action="extend", default=[], type=_dtype, metavar="DTYPE",
                         help="only these input dtypes (bf16, fp16, fp32)")
    filters.add_argument("--shape", nargs="+", action="extend", default=[], type=_shape, metavar="SHAPE",
                         help="only these shapes, e.g. 8192x4096")
    filters.add_argument("--mode", nargs="+", action="extend", default=[], choices=MODES, metavar="MODE",
                         help="only these modes: fwd, fwd_grad (a forward building the graph), bwd (backward alone), full (forward + backward), "
                              "step (optimizer step; for gpt a whole training step)")
    filters.add_argument("--quick", action="store_true", help="the quick suite instead of the full one")
    filters.add_argument("--device", choices=DEVICES,
                         help="where to run (default: the accelerator if present, else cpu)")

    commands.add_parser("list", parents=[filters], help="list the cases (allocates no tensors)",
                        description="List the cases: family, op, shape, dtype, mode, providers.")
    run = commands.add_parser("run", parents=[filters], help="run the selected cases",
                              description="Run the selected cases and print a table on stdout "
                                          "(progress on stderr).")
    run.add_argument("--providers", type=_providers, default=[], metavar="A,B",
                     help="only these providers, e.g. ours,eager,compile (default: all of each case)")
    run.add_argument("--rounds", type=_positive_int, metavar="N",
                     help=f"timed rounds per case (default: {catalog.ROUNDS}, {catalog.QUICK_ROUNDS} with --quick, "
                          "fewer for the seconds-long linear and layer steps)")
    run.add_argument("--json", type=Path, metavar="FILE", help="write the environment and rows as JSON")
    run.add_argument("--csv", type=Path, metavar="FILE", help="write the rows as CSV")
    run.add_argument("--plot", type=Path, metavar="FILE.png",
                     help="plot GB/s against the copy bandwidth and the speedups (needs matplotlib)")
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="also write DIR/<family>_<device>.json/.csv and DIR/summary_<device>.json")
    run.add_argument("--compare", type=Path, metavar="OLD.json",
                     help="print per-row time ratios against an earlier --json (or per-family) file")
    run.add_argument("--fail-if-regression", type=_percent, metavar="PCT",
                     help="with --compare: exit 1 when any of our rows is more than PCT percent slower")
    _add_train_parser(commands)
    _add_parallel_parser(commands)
    return parser


def _add_parallel_parser(commands) -> None:
    cfg = parallel.ParallelConfig()
    parser = commands.add_parser(
        "parallel", help="one tensor-parallel TransformerLayer step on --tp processes: compute, communication, overlap",
        description=parallel.__doc__.splitlines()[0])
    for name in ("tp", "hidden", "ffn", "heads", "seq", "batch", "steps"):
        parser.add_argument(f"--{name}", type=_positive_int, default=getattr(cfg, name),
                            help=f"(default {getattr(cfg, name)})")
    parser.add_argument("--dtype", type=_dtype, default=cfg.dtype, help="bf16, fp16 or fp32 (default bf16)")
    parser.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false",
                        help="tensor parallelism alone (default: with sequence parallelism)")
    parser.add_argument("--device", choices=DEVICES, default=cfg.device, help="cpu (gloo) or a GPU kind (nccl)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")


def run_parallel(args: argparse.Namespace) -> int:
    """te-bench parallel: runs the step on the ranks, prints the table, writes --json."""
    cfg = parallel.ParallelConfig(tp=args.tp, hidden=args.hidden, ffn=args.ffn, heads=args.heads, seq=args.seq,
                                  batch=args.batch, sequence_parallel=args.sequence_parallel, dtype=args.dtype,
                                  steps=args.steps, device=args.device)
    try:
        result = parallel.run(cfg)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print(parallel.table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        env = harness.environment(torch.device(cfg.device), harness.configure_allocator())
        args.json.write_text(json.dumps({"environment": dataclasses.asdict(env), **result}, indent=1, default=str))
    return 0


def _add_train_parser(commands) -> None:
    model, train = GPTConfig(), gpt.TrainConfig()
    parser = commands.add_parser(
        "train", help="train a small GPT per variant: loss curves, tokens/s, memory",
        description="Train a small byte-level GPT on the Python standard library's source, once per variant from "
                    "the same initial weights and batches; print the loss curves, tokens/s, final and held-out "
                    "loss and activation memory of each.")
    parser.add_argument("--steps", type=_positive_int, default=train.steps,
                        help=f"optimizer steps (default {train.steps})")
    for name, text in (("layers", "transformer layers"), ("hidden", "hidden size"),
                       ("heads", "attention heads (as many key/value heads)"), ("seq", "sequence length in bytes"),
                       ("batch", "sequences per step")):
        parser.add_argument(f"--{name}", type=_positive_int, default=getattr(model, name), metavar="N",
                            help=f"{text} (default {getattr(model, name)})")
    parser.add_argument("--lr", type=_positive_float, default=train.lr, help=f"peak learning rate (default {train.lr})")
    parser.add_argument("--seed", type=int, default=train.seed, help="seed of the weights and batches (default 0)")
    parser.add_argument("--variants", type=_variants, default=list(gpt.DEFAULT_VARIANTS), metavar="A,B",
                        help=f"what to train, from {', '.join(gpt.VARIANTS)} "
                             f"(default {','.join(gpt.DEFAULT_VARIANTS)})")
    parser.add_argument("--device", choices=DEVICES,
                        help="where to run (default: the accelerator if present, else cpu)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the environment and the curves as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="plot the loss curves (needs matplotlib)")


def train_config(args: argparse.Namespace) -> gpt.TrainConfig:
    """The run's TrainConfig; UsageError (naming the sizes) for sizes that do not fit together."""
    try:
        model = GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, groups=args.heads, seq=args.seq,
                          batch=args.batch)
        return gpt.TrainConfig(model=model, steps=args.steps, lr=args.lr, seed=args.seed,
                               warmup=min(gpt.TrainConfig.warmup, args.steps))
    except ValueError as error:  # only the sizes' relations are left to check: argparse took the rest
        raise UsageError(f"--hidden/--heads: {error}") from None


def run_train(args: argparse.Namespace, command: Sequence[str]) -> int:
    """te-bench train: trains, prints the curve table and the summary, writes --json/--plot."""
    cfg = train_config(args)
    if args.plot:
        plot.require_matplotlib()
    device = resolve_device(args.device)
    env = harness.environment(device, harness.configure_allocator())
    header = report.environment_header(env, device, False, command)
    model = cfg.model
    print(f"device {env.device} ({env.isa}), {env.threads} threads, torch {env.torch}, portable TE {env.version} "
          f"({env.git_commit})")
    print(f"GPT: {model.layers} layers, hidden {model.hidden}, {model.heads} heads, {model.parameters():,} parameters; "
          f"{cfg.steps} steps of {model.batch}x{model.seq} bytes, lr {cfg.lr:g}", flush=True)
    total = len(args.variants) * cfg.steps
    progress = Progress(total)
    every = max(1, cfg.steps // 5)  # a few progress lines per variant in a log, not one per step
    done = iter(range(1, total + 1))

    def on_step(variant: str, step: int) -> None:
        finished = next(done)
        if (step + 1) % every == 0 and step + 1 < cfg.steps:
            progress.show(finished, f"{variant} (step {step + 2} of {cfg.steps})")
    result = gpt.train(cfg, args.variants, device, on_step)
    progress.clear()
    print("\ntrain loss (nats per byte; ln 256 = 5.55 is a uniform guess):")
    print("\n".join(gpt_report.curve_table(result)))
    print()
    print("\n".join(gpt_report.summary_lines(result)))
    if args.json:
        gpt_report.write_json(args.json, header, result)
        print(f"wrote {args.json}")
    if args.plot:
        gpt_report.write_plot(args.plot, result, f"{header['device']} ({header['isa']}), {header['git_commit']}")
        print(f"wrote {args.plot}")
    return 0


def resolve_device(name: Optional[str]) -> torch.device:
    if name is None:
        return default_device()
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available")
        return torch.device("cuda", torch.cuda.current_device())
    if name == "musa":
        musa = getattr(torch, "musa", None)  # present once torch_musa is imported
        if musa is None or not musa.is_available():
            raise UsageError("--device musa: no MUSA device is available (torch_musa not loaded or no device)")
        return torch.device("musa")
    return torch.device("cpu")


def selected_cases(args: argparse.Namespace, device: torch.device) -> List[catalog.CaseInfo]:
    """Descriptions of the cases the filters select; UsageError for an unknown op or provider
    or when nothing matches."""
    families = args.family or None
    infos = catalog.describe(args.quick, device, families)
    missing = [op for op in args.op if op not in {info.op for info in infos}]
    if missing:  # absent here; unknown only if no family has it in the full suite either
        known = {info.op for info in catalog.describe(False, device)}
        unknown = [op for op in missing if op not in known]
        if unknown:
            raise UsageError(f"--op: unknown op {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    filters = catalog.Filters(ops=tuple(args.op), families=tuple(args.family), dtypes=tuple(args.dtype),
                              shapes=tuple(args.shape), modes=tuple(args.mode))
    chosen = catalog.select(infos, filters)
    providers = getattr(args, "providers", [])
    if providers:
        known = {name for info in infos for name in info.providers}
        unknown = [name for name in providers if name not in known]
        if unknown:
            raise UsageError(f"--providers: unknown provider {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        chosen = [info for info in chosen if set(info.providers) & set(providers)]
    if not chosen:
        suite = "quick" if args.quick else "full"
        raise UsageError(f"no case of the {suite} suite matches the filters (see te-bench list)")
    return chosen


def list_cases(infos: Sequence[catalog.CaseInfo]) -> None:
    columns = ("family", "op", "shape", "dtype", "mode")
    widths = [max([len(name)] + [len(getattr(info, name)) for info in infos]) for name in columns]
    print("  ".join(f"{name:<{w}}" for name, w in zip(columns, widths))
          + "  providers")
    for info in infos:
        cells = (info.family, info.op, info.shape, info.dtype, info.mode)
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(cells, widths)) + "  " + ",".join(info.providers))
    print(f"{len(infos)} cases")


def run_cases(args: argparse.Namespace, device: torch.device, infos: Sequence[catalog.CaseInfo],
              command: Sequence[str]) -> int:
    """Runs the cases, prints the table, writes the requested files; returns the exit status."""
    old_rows = report.load_rows(args.compare) if args.compare else None  # fail before the long run
    if args.plot:
        plot.require_matplotlib()
    allocator = harness.configure_allocator()  # before any big tensor exists
    env = harness.environment(device, allocator)
    header = report.environment_header(env, device, args.quick, command)
    print(f"device {env.device} ({env.isa}), {env.threads} threads, torch {env.torch}, "
          f"portable TE {env.version} ({env.git_commit}); allocator: {env.allocator}")
    peaks = env.peaks is not None  # an accelerator: rows have fractions of its peaks
    if peaks:
        print(f"device peaks: {env.peaks.summary()}")
    print(harness.table_header(peaks), flush=True)
    by_family: Dict[str, List[dict]] = {}
    progress = Progress(len(infos))
    progress.show(0, _label(infos[0]))
    for done, (family, case) in enumerate(catalog.build(infos, args.quick, device), start=1):
        case = catalog.with_providers(case, args.providers)
        rounds = args.rounds or catalog.family_rounds(family, args.quick)
        rows = harness.run_case(case, env, rounds, catalog.WARMUP)
        progress.clear()
        for row in rows:
            print(harness.table_line(row, peaks), flush=True)
        by_family.setdefault(family, []).extend(rows)
        family_done = done == len(infos) or infos[done].family != family
        if args.out and family_done:  # written as each family ends: an interrupted run keeps them
            for path in harness.write_rows(by_family[family], args.out, f"{family}_{device.type}"):
                print(f"wrote {path}", flush=True)
        if done < len(infos):
            progress.show(done, _label(infos[done]))
    progress.clear()
    all_rows = [row for rows in by_family.values() for row in rows]
    print_summary(by_family, all_rows)
    write_outputs(args, device, header, by_family, all_rows)
    if old_rows is None:
        return 0
    comparison = compare.compare(old_rows, all_rows)
    print(f"\ncompared with {args.compare} (new/old p50 time; above 1 is slower):")
    print("\n".join(compare.format_comparison(comparison, args.fail_if_regression)))
    if args.fail_if_regression is not None:
        failing = compare.regressions(comparison, args.fail_if_regression)
        if failing:
            print(f"{len(failing)} of our rows are more than {args.fail_if_regression:g}% slower", file=sys.stderr)
            return 1
    return 0


def _label(info: catalog.CaseInfo) -> str:
    return f"{info.op} {info.shape} {info.dtype} {info.mode}"


def print_summary(by_family: Dict[str, List[dict]], all_rows: List[dict]) -> None:
    print("\ngeometric means of our rows (speedups over eager / torch.compile, fraction of same-run copy bandwidth):")
    for family, rows in [*by_family.items(), ("all", all_rows)]:
        print(f"  {family:<14} {harness.summary_line(harness.geometric_means(rows))}")


def write_outputs(args: argparse.Namespace, device: torch.device, header: dict, by_family: Dict[str, List[dict]],
                  all_rows: List[dict]) -> None:
    if args.out:  # the per-family files were written as each family ended
        summary = {family: harness.geometric_means(rows) for family, rows in by_family.items()}
        summary["all"] = harness.geometric_means(all_rows)
        print(f"wrote {harness.write_summary(summary, args.out, f'summary_{device.type}')}")
    if args.json:
        report.write_json(args.json, header, all_rows)
        print(f"wrote {args.json}")
    if args.csv:
        report.write_csv(args.csv, all_rows)
        print(f"wrote {args.csv}")
    if args.plot:
        plot.write_plot(args.plot, all_rows, f"{header['device']} ({header['isa']}), {header['git_commit']}")
        print(f"wrote {args.plot}")


def _suite_run_args(args: argparse.Namespace, quick: bool) -> argparse.Namespace:
    """No subcommand: every case of the suite. The full suite writes per-family files and a
    summary in --out; the quick one DIR/quick_<device>.json, .csv and, with matplotlib, .png
    (the device is filled in by _name_quick_files)."""
    return argparse.Namespace(command="run", quick=quick, op=[], family=[], dtype=[], shape=[], mode=[], device=None,
                              providers=[], rounds=None, json=None, csv=None, plot=None,
                              out=None if quick else args.suite_out, quick_files=args.suite_out if quick else None,
                              compare=None, fail_if_regression=None)


def _name_quick_files(args: argparse.Namespace, device: torch.device) -> None:
    stem = args.quick_files / f"quick_{device.type}"
    args.json, args.csv = stem.with_suffix(".json"), stem.with_suffix(".csv")
    if plot.matplotlib_available():
        args.plot = stem.with_suffix(".png")
    else:
        print(f"no plot: matplotlib is not installed (pip install matplotlib for {stem}.png)")


def main(argv: Optional[Sequence[str]] = None, prog: str = "te-bench", default_quick: bool = True) -> int:
    """Entry point of te-bench (default_quick: a plain `te-bench` runs the quick suite) and of
    `python -m transformer_engine.bench` (default_quick False: the full suite unless --quick)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exit:  # a bad argument (2, reported), or --help (0)
        return int(exit.code or 0)
    try:
        if args.command is None:
            args = _suite_run_args(args, default_quick or args.suite_quick)
        if args.command == "train":
            return run_train(args, [prog, *argv])
        if args.command == "parallel":
            return run_parallel(args)
        if getattr(args, "fail_if_regression", None) is not None and args.compare is None:
            raise UsageError("--fail-if-regression needs --compare OLD.json")
        device = resolve_device(args.device)
        if getattr(args, "quick_files", None) is not None:
            _name_quick_files(args, device)
        infos = selected_cases(args, device)
        if args.command == "list":
            list_cases(infos)
            return 0
        return run_cases(args, device, infos, [prog, *argv])
    except (UsageError, report.ResultsError, plot.PlotUnavailable) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
