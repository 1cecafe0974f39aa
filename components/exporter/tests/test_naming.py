"""Metric names follow Prometheus conventions and the README lists each with type, unit, labels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lj_runtimekit_exporter import naming

README = Path(__file__).parents[1] / "README.md"
UNIT_SUFFIX = {
    "bytes": "_bytes",
    "ratio": "_ratio",
    "celsius": "_celsius",
    "watts": "_watts",
    "hertz": "_hertz",
    "joules": "_joules",
    "seconds": "_seconds",
}


@pytest.mark.parametrize("metric", naming.ALL, ids=lambda m: m.exposed)
def test_name_has_the_prefix_its_base_unit_and_total_only_on_counters(
    metric: naming.Metric,
) -> None:
    assert metric.name.startswith(naming.PREFIX)
    assert re.fullmatch(r"[a-z_][a-z0-9_]*", metric.name)
    assert not metric.name.endswith("_total"), "the _total is added on exposition"
    assert metric.exposed.endswith("_total") == (metric.kind == "counter")
    suffix = UNIT_SUFFIX.get(metric.unit)
    if suffix is not None:
        assert metric.name.endswith(suffix)
    assert "node" in metric.labels


def test_every_metric_is_in_the_readme_table_with_its_type_unit_and_labels() -> None:
    row = re.compile(r"^\| `(\w+)` \| (\w+) \| (\w+) \| ([\w, ]+) \|", re.M)
    rows = {m.group(1): m.group(2, 3, 4) for m in row.finditer(README.read_text())}
    for metric in naming.ALL:
        assert rows.get(metric.exposed) == (metric.kind, metric.unit, ", ".join(metric.labels)), (
            f"README row of {metric.exposed} is missing or differs"
        )
    assert set(rows) == {m.exposed for m in naming.ALL}


def test_names_are_unique() -> None:
    assert len({m.name for m in naming.ALL}) == len(naming.ALL)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("H800", "H800"),
        ("a\nb\x00c", "abc"),
        ("模型-ü", "模型-ü"),
        ("x" * 500, "x" * naming.MAX_LABEL_LENGTH),
        (7, "7"),
    ],
    ids=["plain", "control-chars", "unicode", "long", "int"],
)
def test_label_values_are_printable_and_bounded(raw: object, expected: str) -> None:
    assert naming.label_value(raw) == expected


@pytest.mark.parametrize(
    ("raw", "signed", "expected"),
    [
        (0.5, False, 0.5),
        (float("nan"), False, None),
        (float("inf"), False, None),
        (-1.0, False, None),
        (-10.0, True, -10.0),
        (1e300, False, 1e300),
    ],
    ids=["ok", "nan", "inf", "negative", "negative-temperature", "huge"],
)
def test_impossible_readings_are_dropped(raw: float, signed: bool, expected: float | None) -> None:
    metric = naming.Metric("lj_runtimekit_x", "gauge", "ratio", ("node",), "x", signed)
    assert naming.sample_value(metric, raw) == expected
