"""`make test` runs each component's unit tests once: the isolated phase runs them, the main run
leaves exactly those out (``--lj-units-isolated``), and together they run every test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from lj_runtimekit_testkit.isolated_units import NEEDS

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = "components/operator/tests"  # markers of both kinds, few tests: a quick collection


def _collected(*args: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def _makefile_mark() -> str:
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "isolation", "COMPONENTS=operator"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    m = re.search(r'-m "([^"]*)"', out)
    assert m, out
    return m[1]


def test_the_makefile_isolates_by_the_same_markers() -> None:
    assert _makefile_mark() == " and ".join(f"not {m}" for m in NEEDS)
    text = (ROOT / "Makefile").read_text()
    assert f"ISOLATED_NEEDS := {' '.join(NEEDS)}\n" in text


def test_the_main_run_leaves_out_exactly_what_the_isolated_run_runs() -> None:
    every = _collected(COMPONENT)
    isolated = _collected(COMPONENT, "-m", _makefile_mark())
    main = _collected(COMPONENT, "--lj-units-isolated")
    assert isolated, "the isolated run runs some of them"
    assert main, "the main run keeps those that need a peer"
    assert main.isdisjoint(isolated)
    assert main | isolated == every
