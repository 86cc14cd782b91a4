"""python -m transformer_engine.bench [--quick] [--out DIR]

Runs every op family's suite (FAMILIES below) on the default device (the accelerator if
present, else the CPU), prints a table as it goes and writes DIR/<family>_<device>.json and
.csv (overwriting them), then the geometric means of our speedups and bandwidth fractions per
family and overall (DIR/summary_<device>.json).
"""
import argparse
from pathlib import Path
from typing import List, Optional

from transformer_engine.pytorch import default_device

from . import (activation_cases, adam_cases, cross_entropy_cases, fp8_cast_cases, harness, layer_cases, linear_cases,
               norm_cases, rope_cases, softmax_cases)

ROUNDS, QUICK_ROUNDS, WARMUP = 20, 10, 3
FAMILIES = {"norm": norm_cases.cases, "fp8_cast": fp8_cast_cases.cases, "linear": linear_cases.cases,
            "activation": activation_cases.cases, "softmax": softmax_cases.cases,
            "cross_entropy": cross_entropy_cases.cases, "rope": rope_cases.cases, "adam": adam_cases.cases,
            "layer": layer_cases.cases}
FAMILY_ROUNDS = {"linear": linear_cases.ROUNDS, "layer": layer_cases.ROUNDS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_engine.bench",
                                     description="Benchmark our fused ops against PyTorch eager and torch.compile.")
    parser.add_argument("--quick", action="store_true",
                        help=f"only [8192, 4096] bf16, {QUICK_ROUNDS} rounds instead of {ROUNDS} "
                             "(about a minute on 2 CPU cores)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="directory for the JSON and CSV results (default: benchmarks/results)")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    allocator = harness.configure_allocator()  # before any big tensor exists
    device = default_device()
    env = harness.environment(device, allocator)
    print(f"device {env.device} ({env.isa}), {env.threads} threads, torch {env.torch}, "
          f"portable TE {env.version} ({env.git_commit}); allocator: {env.allocator}")
    print(harness.table_header(), flush=True)
    summary = {}
    all_rows = []
    for family, cases in FAMILIES.items():
        rows = []
        rounds = QUICK_ROUNDS if args.quick else FAMILY_ROUNDS.get(family, ROUNDS)
        for case in cases(args.quick, device):
            for row in harness.run_case(case, env, rounds, WARMUP):
                print(harness.table_line(row), flush=True)
                rows.append(row)
        for path in harness.write_rows(rows, args.out, f"{family}_{device.type}"):
            print(f"wrote {path}")
        summary[family] = harness.geometric_means(rows)
        all_rows += rows
    summary["all"] = harness.geometric_means(all_rows)
    print("\ngeometric means of our rows (speedups over eager / torch.compile, fraction of same-run copy bandwidth):")
    for family, means in summary.items():
        print(f"  {family:<14} {harness.summary_line(means)}")
    path = harness.write_summary(summary, args.out, f"summary_{device.type}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
