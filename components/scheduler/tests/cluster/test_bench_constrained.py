"""The scheduler benchmark's issue-35 phases run end to end at a tiny size under both schedulers,
in one run of the bench: the constrained phase (a third of the pods with required pod
anti-affinity, a third spread over racks, a sixth with a claim bound to a rack's PV, a sixth with
a WaitForFirstConsumer claim and local PVs) and the preemption phase (the pool full of
low-priority pods, high-priority whole-GPU pods). Every pod is bound by each; victims are counted.
Timings are recorded, never asserted.

Two rows, the same phases: ``short`` runs in the suite (``make test``), ``long`` (the size that
shows the constrained phase's unbound pods, a strict xfail) only where ``LJ_SCHED_BENCH_LONG=1``:
``make bench-scheduler-smoke``, which ``make bench-scheduler`` runs first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).parents[4]
BENCH = ROOT / "components" / "scheduler" / "bench" / "run.py"
FILLER_GPUS = 4
LONG_ENV = "LJ_SCHED_BENCH_LONG"


@dataclass(frozen=True)
class Row:
    """One size of the bench run."""

    nodes: int
    pods: int
    """Pods of the constrained phase."""
    preemptors: int
    deadline_s: int
    """Seconds each phase waits for its pods at most, under each scheduler."""


SHORT = Row(nodes=16, pods=18, preemptors=4, deadline_s=60)
"""16 nodes (2 racks of 8): 6 anti-affinity pods (6 of the 10 groups), 6 spread over the 2
racks, 3 with a rack's bound claim, 3 with a WaitForFirstConsumer claim (a local PV on each of 3
nodes); 32 fillers of 4 GPUs hold the 128 GPUs: 4 one-GPU preemptors need 1 of them gone."""
LONG = Row(nodes=16, pods=60, preemptors=10, deadline_s=120)
"""20 anti-affinity pods (2 per group: two nodes), 20 spread over the 2 racks of 16 nodes, 10
with a rack's bound claim, 10 with a WaitForFirstConsumer claim (a local PV on each of 10 nodes);
10 one-GPU preemptors need 3 of the 32 fillers gone."""

_ONLY_LONG = pytest.mark.skipif(
    os.environ.get(LONG_ENV) != "1",
    reason=f"the long row runs with {LONG_ENV}=1 (make bench-scheduler-smoke), not in make test",
)
_UNBOUND = pytest.mark.xfail(
    strict=True,
    reason="defect not yet found: with the phase's claims, a few pods (WaitForFirstConsumer "
    "local PVs suspected: kube-scheduler's p-53 was still in VolumeBinding PreBind when deleted) "
    "stay unbound past the 120 s deadline under both schedulers (55 and 58 of 60, twice); the "
    "same claims alone bind at once (10 of 10)",
)
SHORT_ROW = pytest.param(SHORT, id="short")
Figures = tuple[Row, list[dict[str, Any]]]
"""The row the bench ran at, and the figures it wrote."""


@pytest.fixture(scope="module")
def figures(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Figures:
    row: Row = request.param
    out = tmp_path_factory.mktemp("bench")
    argv = [sys.executable, str(BENCH), "--out", str(out), "--cases", "classic"]
    argv += ["--nodes", str(row.nodes), "--pods", "4", "--mixed", "2", "--gangs", "1"]
    argv += ["--gang-size", "2", "--constrained", str(row.pods)]
    argv += ["--preemptors", str(row.preemptors), "--filler-gpus", str(FILLER_GPUS)]
    argv += ["--clients", "5000/5000", "--deadline", str(row.deadline_s)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads((out / "scheduler.json").read_text())["figures"]
    return row, rows


def one(figures: list[dict[str, Any]], what: str, phase: str) -> dict[str, Any]:
    rows = [f for f in figures if f["name"].startswith(f"{what},") and phase in f["name"]]
    assert len(rows) == 1, [f["name"] for f in figures]
    return rows[0]


@pytest.mark.parametrize(
    "figures",
    [SHORT_ROW, pytest.param(LONG, id="long", marks=[_ONLY_LONG, _UNBOUND])],
    indirect=True,
)
@pytest.mark.timeout(600)
def test_constrained_phase_binds_every_pod_under_both_schedulers(figures: Figures) -> None:
    row, rows = figures
    bound = one(rows, "pods bound", "constrained")
    assert (bound["value"], bound["anchor"]) == (row.pods, row.pods)
    assert one(rows, "pods/s", "constrained")["value"] > 0
    rss = one(rows, "peak RSS", "constrained")
    assert rss["value"] > 0
    assert rss["anchor"] > 0


@pytest.mark.parametrize(
    "figures", [SHORT_ROW, pytest.param(LONG, id="long", marks=_ONLY_LONG)], indirect=True
)
@pytest.mark.timeout(600)
def test_preemption_phase_binds_every_preemptor_and_counts_the_victims(figures: Figures) -> None:
    row, rows = figures
    bound = one(rows, "pods bound", "preemption")
    assert (bound["value"], bound["anchor"]) == (row.preemptors, row.preemptors)
    needed = one(rows, "victims needed", "preemption")
    victims = one(rows, "victims", "preemption")
    # the pool was full: each scheduler evicted at least the 4-GPU pods its preemptors needed
    least = -(-row.preemptors // FILLER_GPUS)
    assert needed["value"] >= least
    assert needed["anchor"] >= least
    assert victims["value"] >= needed["value"]
    assert victims["anchor"] >= needed["anchor"]
    excess = one(rows, "victims beyond need", "preemption")
    assert excess["value"] == victims["value"] - needed["value"]
