"""Benchmarks: each component's ``bench/run.py`` measures, then :func:`write` records.

Figures go to ``build/bench/<component>.json`` as a list of named figures with a unit; compared
figures also carry the anchor's value and the ratio ours/anchor. ``make bench`` runs every
script and prints one table.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Figure:
    """One measured figure."""

    name: str
    value: float
    unit: str
    anchor: float | None = None
    """The same figure measured for the anchor (e.g. kube-scheduler) in the same run."""
    anchor_name: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.anchor is None or self.anchor == 0:
            return None
        return self.value / self.anchor


def write(out_dir: Path, component: str, figures: list[Figure]) -> Path:
    """Write the figures of one component to ``<out_dir>/<component>.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{component}.json"
    rows = []
    for f in figures:
        if not math.isfinite(f.value):
            raise ValueError(f"benchmark figure {f.name} is not finite: {f.value}")
        row = asdict(f)
        row["ratio"] = f.ratio
        rows.append(row)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"component": component, "figures": rows}, indent=2) + "\n")
    tmp.replace(path)
    return path


def table(paths: list[Path]) -> str:
    """A plain-text table of every figure in ``paths``."""
    lines = [
        f"{'component':<14} {'figure':<58} {'value':>14} {'unit':<8} {'anchor':>14} {'ratio':>7}"
    ]
    for path in paths:
        data = json.loads(path.read_text())
        for row in data["figures"]:
            anchor = "" if row["anchor"] is None else f"{row['anchor']:.4g}"
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
            lines.append(
                f"{data['component']:<14} {row['name']:<58} {row['value']:>14.4g} "
                f"{row['unit']:<8} {anchor:>14} {ratio:>7}"
            )
    return "\n".join(lines)
