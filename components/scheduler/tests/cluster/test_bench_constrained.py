"""The scheduler benchmark's issue-35 phases run end to end at a tiny size under both schedulers,
in one run of the bench: the constrained phase (a third of the pods with required pod
anti-affinity, a third spread over racks, a sixth with a claim bound to a rack's PV, a sixth with
a WaitForFirstConsumer claim and local PVs) and the preemption phase (the pool full of
low-priority pods, high-priority whole-GPU pods). Every pod is bound by each; victims are counted.
Timings are recorded, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).parents[4]
BENCH = ROOT / "components" / "scheduler" / "bench" / "run.py"
NODES = 16
PODS = 60
"""20 anti-affinity pods (2 per group: two nodes), 20 spread over the 2 racks of 16 nodes, 10
with a rack's bound claim, 10 with a WaitForFirstConsumer claim (a local PV on each of 10 nodes)."""
PREEMPTORS = 10
FILLER_GPUS = 4
"""32 fillers of 4 GPUs hold the 16 nodes' 128 GPUs: 10 one-GPU preemptors need 3 of them gone."""


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    argv = [sys.executable, str(BENCH), "--out", str(out), "--cases", "classic"]
    argv += ["--nodes", str(NODES), "--pods", "4", "--mixed", "2", "--gangs", "1"]
    argv += ["--gang-size", "2", "--constrained", str(PODS), "--preemptors", str(PREEMPTORS)]
    argv += ["--filler-gpus", str(FILLER_GPUS), "--clients", "5000/5000", "--deadline", "120"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads((out / "scheduler.json").read_text())["figures"]
    return rows


def one(figures: list[dict[str, Any]], what: str, phase: str) -> dict[str, Any]:
    rows = [f for f in figures if f["name"].startswith(f"{what},") and phase in f["name"]]
    assert len(rows) == 1, [f["name"] for f in figures]
    return rows[0]


@pytest.mark.xfail(
    strict=True,
    reason="defect not yet found: with the phase's claims, a few pods (WaitForFirstConsumer "
    "local PVs suspected: kube-scheduler's p-53 was still in VolumeBinding PreBind when deleted) "
    "stay unbound past the 120 s deadline under both schedulers (55 and 58 of 60, twice); the "
    "same claims alone bind at once (10 of 10)",
)
@pytest.mark.timeout(600)
def test_constrained_phase_binds_every_pod_under_both_schedulers(
    figures: list[dict[str, Any]],
) -> None:
    bound = one(figures, "pods bound", "constrained")
    assert (bound["value"], bound["anchor"]) == (PODS, PODS)
    assert one(figures, "pods/s", "constrained")["value"] > 0
    rss = one(figures, "peak RSS", "constrained")
    assert rss["value"] > 0
    assert rss["anchor"] > 0


@pytest.mark.timeout(600)
def test_preemption_phase_binds_every_preemptor_and_counts_the_victims(
    figures: list[dict[str, Any]],
) -> None:
    bound = one(figures, "pods bound", "preemption")
    assert (bound["value"], bound["anchor"]) == (PREEMPTORS, PREEMPTORS)
    needed = one(figures, "victims needed", "preemption")
    victims = one(figures, "victims", "preemption")
    # the pool was full: each scheduler evicted at least the 4-GPU pods its preemptors needed
    least = -(-PREEMPTORS // FILLER_GPUS)
    assert needed["value"] >= least
    assert needed["anchor"] >= least
    assert victims["value"] >= needed["value"]
    assert victims["anchor"] >= needed["anchor"]
    excess = one(figures, "victims beyond need", "preemption")
    assert excess["value"] == victims["value"] - needed["value"]
