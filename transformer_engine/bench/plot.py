"""--plot FILE.png: achieved GB/s of every row against the same-run copy bandwidth, and our
speedups over eager and torch.compile. matplotlib is imported only here, when a plot is asked
for; it is not a dependency of the package."""
import importlib.util
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence


class PlotUnavailable(RuntimeError):
    pass


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib() -> None:
    """Raises PlotUnavailable with a one-line reason when matplotlib is not installed (checked
    before a run, so a long run does not end without its plot)."""
    if not matplotlib_available():
        raise PlotUnavailable("--plot needs matplotlib, which is not installed (pip install matplotlib)")


def plot_data(rows: Sequence[dict]) -> Dict[str, object]:
    """What the figure draws, from result rows:
    labels: one per case ("op shape dtype mode"), in run order;
    gbps: provider -> GB/s per label (None where that row has no byte count or is absent);
    copy_gbps: the median same-run copy bandwidth over all rows (None without rows);
    speedups: ("vs eager" / "vs compile") -> our speedup per label (None where absent)."""
    labels: List[str] = []
    by_label: Dict[str, Dict[str, dict]] = {}
    for row in rows:
        label = f"{row['op']} {row['shape']} {row['dtype']} {row['mode']}"
        if label not in by_label:
            labels.append(label)
            by_label[label] = {}
        by_label[label][row["provider"]] = row
    providers = list(dict.fromkeys(row["provider"] for row in rows))

    def series(provider: str, field: str) -> List[Optional[float]]:
        return [by_label[label].get(provider, {}).get(field) for label in labels]
    return dict(labels=labels, gbps={p: series(p, "gbps") for p in providers},
                copy_gbps=statistics.median(row["copy_gbps"] for row in rows) if rows else None,
                speedups={"vs eager": series("ours", "speedup_vs_eager"),
                          "vs compile": series("ours", "speedup_vs_compile")})


def write_plot(path: Path, rows: Sequence[dict], title: str) -> None:
    """Two stacked bar charts over the cases: GB/s per provider with the copy bandwidth as a
    horizontal line, and our speedups with the break-even line at 1."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    data = plot_data(rows)
    labels = data["labels"]
    positions = range(len(labels))
    figure, (bandwidth, speed) = plt.subplots(2, 1, figsize=(max(8, 0.6 * len(labels) + 3), 9), sharex=True)
    _bars(bandwidth, positions, data["gbps"])
    if data["copy_gbps"] is not None:
        bandwidth.axhline(data["copy_gbps"], color="black", linestyle="--", label="copy (same run)")
    bandwidth.set_ylabel("achieved GB/s")
    bandwidth.legend(fontsize="small")
    bandwidth.set_title(title)
    _bars(speed, positions, data["speedups"])
    speed.axhline(1.0, color="black", linewidth=0.8)
    speed.set_ylabel("our speedup (x)")
    speed.legend(fontsize="small")
    speed.set_xticks(list(positions), labels, rotation=60, ha="right", fontsize="small")
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _bars(axes, positions, series: Dict[str, List[Optional[float]]]) -> None:
    """Grouped bars, one group per position; missing values (None) drawn as gaps."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        heights = [float("nan") if v is None else v for v in values]
        axes.bar([p + (i - (len(series) - 1) / 2) * width for p in positions], heights, width, label=name)
