"""Per-row time ratios of a run against an earlier one, and the regression gate.

Rows are matched on (op, shape, dtype, mode, provider). The ratio is new p50 / old p50: above 1
is slower. Only our providers (names starting with "ours") can fail the gate; the baselines'
times are shown for context (a slower eager row hints at a noisier machine, not a regression).
"""
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from .report import KEY_FIELDS

Key = Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Change:
    key: Key
    old_ms: float
    new_ms: float

    @property
    def ratio(self) -> float:
        return self.new_ms / self.old_ms

    @property
    def ours(self) -> bool:
        return self.key[KEY_FIELDS.index("provider")].startswith("ours")


@dataclasses.dataclass(frozen=True)
class Comparison:
    changes: List[Change]
    only_new: List[Key]  # rows with no earlier counterpart
    only_old: List[Key]  # earlier rows this run did not produce


def key_of(row: dict) -> Key:
    return tuple(str(row[field]) for field in KEY_FIELDS)


def compare(old_rows: Sequence[dict], new_rows: Sequence[dict]) -> Comparison:
    """Matches rows on KEY_FIELDS, in the new run's order. A key repeated in one file keeps its
    last row."""
    old: Dict[Key, dict] = {key_of(row): row for row in old_rows}
    new: Dict[Key, dict] = {key_of(row): row for row in new_rows}
    changes = [Change(key, float(old[key]["p50_ms"]), float(row["p50_ms"])) for key, row in new.items() if key in old]
    return Comparison(changes=changes, only_new=[key for key in new if key not in old],
                      only_old=[key for key in old if key not in new])


def regressions(comparison: Comparison, percent: float) -> List[Change]:
    """Our rows more than `percent` percent slower than before (ratio > 1 + percent / 100)."""
    return [c for c in comparison.changes if c.ours and c.ratio > 1 + percent / 100]


def format_comparison(comparison: Comparison, percent: Optional[float] = None) -> List[str]:
    """Printable lines: one per matched row (old and new p50 ms, ratio, percent change; rows over
    the gate marked REGRESSION), then counts of unmatched rows."""
    header = f"{'op':<24} {'shape':<16} {'dtype':<9} {'mode':<5} {'provider':<11} " \
             f"{'old ms':>10} {'new ms':>10} {'new/old':>8} {'change':>8}"
    lines = [header]
    failing = set(c.key for c in regressions(comparison, percent)) if percent is not None else set()
    for c in comparison.changes:
        op, shape, dtype, mode, provider = c.key
        mark = "  REGRESSION" if c.key in failing else ""
        lines.append(f"{op:<24} {shape:<16} {dtype:<9} {mode:<5} {provider:<11} {c.old_ms:>10.3f} "
                     f"{c.new_ms:>10.3f} {c.ratio:>7.2f}x {c.ratio - 1:>+8.1%}{mark}")
    if comparison.only_new:
        lines.append(f"{len(comparison.only_new)} rows have no earlier counterpart")
    if comparison.only_old:
        lines.append(f"{len(comparison.only_old)} earlier rows were not run this time")
    return lines
