"""The suite in parallel workers (pytest-xdist, ``--dist loadfile``): each test file runs whole on
one worker, so its module fixtures (a real cluster, a registry) start once, and each worker starts
its own session ``cluster`` where a file needs one. Nothing else is shared between workers: the
harness claims bridges, veths, cgroup roots, ports and temp dirs per process.

The suite mostly waits, so the worker that gets the longest file last decides the run's length.
Files are therefore handed out longest first (``tests/durations.json``, seconds per file as one
run measured them; a file not in it counts as short) — the classic longest-processing-time order,
which xdist keeps with ``--no-loadscope-reorder``. Every run writes what it measured to
``--lj-durations-out`` so the table can be refreshed (``make test-durations``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[2] / "durations.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lj-runtimekit")
    group.addoption(
        "--lj-durations-out",
        metavar="PATH",
        default=None,
        help="write the seconds each test file took (setup, call, teardown) as JSON to PATH",
    )


def expected_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """File (relative to the repository) → seconds; empty when the table is missing or not JSON
    (the order then stays pytest's, which is correct, only slower)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): float(v) for k, v in table.items() if isinstance(v, int | float)}


def longest_first(files: list[str], seconds: dict[str, float]) -> list[str]:
    """``files`` ordered by expected seconds, longest first; ties keep their order."""
    order = {f: i for i, f in enumerate(files)}
    return sorted(files, key=lambda f: (-seconds.get(f, 0.0), order[f]))


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _parallel(config):
        return
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[_file_of(item)].append(item)
    ordered = longest_first(list(by_file), expected_seconds())
    items[:] = [item for f in ordered for item in by_file[f]]


def _parallel(config: pytest.Config) -> bool:
    # On the controller `-n` is set; on a worker PYTEST_XDIST_WORKER is. Both must order alike.
    workers = getattr(config.option, "numprocesses", None)
    return bool(workers) or "PYTEST_XDIST_WORKER" in os.environ


class _Clock:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if "PYTEST_XDIST_WORKER" in os.environ:
            return  # the controller gets every worker's reports and writes the whole table
        table = {f: round(s, 1) for f, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1) + "\n")
        tmp.replace(self.out)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # A worker's temp dir is <basetemp>/popen-gwN: shortened to gwN, since unix socket paths under
    # tmp_path must stay within 108 bytes (before the tmpdir plugin reads the option).
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = getattr(config.option, "basetemp", None)
    if worker and base and Path(base).name == f"popen-{worker}":
        config.option.basetemp = str(Path(base).with_name(worker))
    out = config.getoption("--lj-durations-out")
    if out:
        config.pluginmanager.register(_Clock(Path(out)), "lj-durations")
