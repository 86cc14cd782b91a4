"""`te-bench train` output: the loss-curve table, the per-variant summary, the JSON file and the
loss-curve plot of a gpt.train() result.

JSON (report.SCHEMA): {"schema": 1, "environment": report.environment_header(...),
                       "train": gpt.train()'s dict: config, corpus, variants (losses per step,
                                final_loss, heldout_loss, tokens_per_s, saved_mb, ...),
                                fp8_loss_vs_high_precision_pct}
"""
import json
import math
from pathlib import Path
from typing import Dict, List

from . import harness, plot, report

START_LOSS = math.log(256)  # a uniform guess over bytes


def curve_steps(steps: int, rows: int = 10) -> List[int]:
    """About `rows` step indices (0-based) spread over the run: every k-th, and always the last."""
    every = max(1, steps // rows)
    indices = list(range(0, steps, every))
    if indices[-1] != steps - 1:
        indices.append(steps - 1)
    return indices


def curve_table(result: Dict[str, object]) -> List[str]:
    """Lines: "step" then each variant's train loss at curve_steps (steps counted from 1)."""
    variants: Dict[str, dict] = result["variants"]
    names = list(variants)
    steps = len(next(iter(variants.values()))["losses"])
    lines = ["step   " + "".join(f"{name:>10}" for name in names)]
    for index in curve_steps(steps):
        lines.append(f"{index + 1:<7}" + "".join(f"{variants[name]['losses'][index]:>10.3f}" for name in names))
    return lines


def summary_lines(result: Dict[str, object]) -> List[str]:
    """One line per variant: tokens/s, final and held-out loss, saved MB; then FP8 against high
    precision."""
    lines = [f"{'variant':<9} {'dtype':<9} {'tokens/s':>9} {'final loss':>10} {'held-out':>9} {'saved MB':>9}"]
    for name, v in result["variants"].items():
        lines.append(f"{name:<9} {v['dtype']:<9} {harness._fmt(v['tokens_per_s'], '{:.0f}'):>9} "
                     f"{v['final_loss']:>10.3f} {v['heldout_loss']:>9.3f} {harness._fmt(v['saved_mb'], '{:.1f}'):>9}")
    relative = result["fp8_loss_vs_high_precision_pct"]
    if relative is not None:
        lines.append(f"ours_fp8 final loss vs ours: {relative:+.2f}%")
    return lines


def write_json(path: Path, environment: dict, result: Dict[str, object]) -> None:
    document = {"schema": report.SCHEMA, "environment": environment, "train": result}
    report._write(path, lambda f: json.dump(document, f, indent=1))


def write_plot(path: Path, result: Dict[str, object], title: str) -> None:
    """The train loss of every variant against the step, with the uniform-guess start ln(256)."""
    plot.require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for name, v in result["variants"].items():
        axes.plot(range(1, len(v["losses"]) + 1), v["losses"], label=f"{name} ({v['dtype']})", linewidth=1)
    axes.axhline(START_LOSS, color="black", linestyle="--", linewidth=0.8, label="ln 256 (uniform)")
    axes.set_xlabel("step")
    axes.set_ylabel("train loss (nats per byte)")
    axes.set_title(title, fontsize="small")
    axes.legend(fontsize="small")
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
