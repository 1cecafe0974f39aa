"""`make test`'s clock (tests/tools/phases.py): phases wait for what they need, a failed phase
stops its dependents and fails the run, and the table names every phase."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "phases.py"


@pytest.fixture(scope="module")
def phases() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lj_phases", TOOL)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["lj_phases"] = module
    spec.loader.exec_module(module)
    return module


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def test_a_phase_starts_only_after_what_it_needs(phases: ModuleType, tmp_path: Path) -> None:
    mark = tmp_path / "first"
    plan = [
        phases.Phase("first", sh(f"sleep 0.2; touch {mark}")),
        phases.Phase("second", sh(f"test -f {mark}"), needs=("first",)),
    ]
    clock = phases.Clock(plan, tmp_path / "logs")
    assert clock.run()
    assert [p.status for p in plan] == ["passed", "passed"]


def test_a_failed_phase_skips_its_dependents_and_fails_the_run(
    phases: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = [
        phases.Phase("build", sh("echo compiler said no; exit 3")),
        phases.Phase("other", sh("true")),
        phases.Phase("tests", sh("true"), needs=("build",)),
    ]
    clock = phases.Clock(plan, tmp_path / "logs")
    assert not clock.run()
    assert {p.name: p.status for p in plan} == {
        "build": "failed",
        "other": "passed",
        "tests": "skipped",
    }
    out = capsys.readouterr().out
    assert "build| compiler said no" in out, "a failed phase's log tail is printed"
    assert (tmp_path / "logs" / "build.log").read_text() == "compiler said no\n"
    table = clock.table()
    for name in ("build", "other", "tests", "total (wall)"):
        assert name in table


def test_make_test_has_the_phases_the_issue_names(phases: ModuleType) -> None:
    names = [p.name for p in phases.phases(["make"], "3")]
    assert names == ["setup", "binaries", "lint", "images", "isolated", "tests"]
