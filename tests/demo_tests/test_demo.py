"""`make demo ARGS=--once` end to end on real nodes: every sample workload placed on the expected
node with its injection, allocation and pod-labelled series, twice (deleted and resubmitted in
between), the agents' Jobs run on every node, and no allocation left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """Short, as unix socket paths must stay under 108 bytes (pytest's tmp_path is too long)."""
    path = Path(tempfile.mkdtemp(prefix="ljdemo-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_demo_once_places_every_workload_and_exits_zero(work_dir: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lj_runtimekit_testkit.demo",
            "--once",
            "--kwok-nodes=10",
            f"--work-dir={work_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = run.stdout
    assert run.returncode == 0, f"demo failed:\n{out}\n{run.stderr[-3000:]}"
    assert "DEMO OK" in out
    assert "the Runtime holds only the live pods' allocations" in out
    tables = out.split("\nworkload ")[1:]
    assert len(tables) == 2, out
    for table in tables:
        for name in ("train-4gpu", "infer-shared-a", "infer-shared-b", "ppu-job", "gang-0"):
            (row,) = [ln for ln in table.splitlines() if ln.startswith(name + " ")]
            assert " Running " in row
            assert row.split()[7] == "yes", row  # placed, injected, allocated as decided, measured
        (train,) = [ln for ln in table.splitlines() if ln.startswith("train-4gpu ")]
        assert "demo-gpu-nvlink" in train
        (ppu,) = [ln for ln in table.splitlines() if ln.startswith("ppu-job ")]
        assert "demo-ppu" in ppu
    assert out.count("enable succeeded / True") == 3
