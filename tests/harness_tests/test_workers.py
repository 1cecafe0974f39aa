"""The parallel run's order: test files longest first, from the durations table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lj_runtimekit_testkit.workers import DURATIONS, expected_seconds, longest_first


@pytest.mark.parametrize(
    ("files", "seconds", "expected"),
    [
        (["a", "b", "c"], {}, ["a", "b", "c"]),
        (["a", "b", "c"], {"c": 9.0, "a": 1.0}, ["c", "a", "b"]),
        (["a", "b", "c"], {"a": 2.0, "b": 2.0, "c": 2.0}, ["a", "b", "c"]),
        (["x", "y"], {"z": 100.0}, ["x", "y"]),
    ],
    ids=["no-table-keeps-order", "longest-first-unknown-last", "ties-keep-order", "stale-entry"],
)
def test_files_are_handed_out_longest_first(
    files: list[str], seconds: dict[str, float], expected: list[str]
) -> None:
    assert longest_first(files, seconds) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a.py": 3, "b.py": 1.5}', {"a.py": 3.0, "b.py": 1.5}),
        ('{"a.py": "slow", "b.py": 2}', {"b.py": 2.0}),
        ("[1, 2]", {}),
        ("not json", {}),
    ],
    ids=["numbers", "non-number-skipped", "not-a-table", "garbage"],
)
def test_a_bad_durations_table_only_loses_the_order(
    tmp_path: Path, text: str, expected: dict[str, float]
) -> None:
    path = tmp_path / "durations.json"
    path.write_text(text)
    assert expected_seconds(path) == expected


def test_a_missing_table_gives_no_order(tmp_path: Path) -> None:
    assert expected_seconds(tmp_path / "absent.json") == {}


def test_the_committed_table_names_only_files_that_exist() -> None:
    table = json.loads(DURATIONS.read_text())
    repo = DURATIONS.parents[1]
    missing = [f for f in table if not (repo / f).is_file()]
    assert not missing, f"tests/durations.json names files that are gone: {missing}"
