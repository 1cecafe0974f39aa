"""The scheduler benchmark's DRA case (issue 24) runs end to end at a tiny size: its own control
plane, all three pools, every phase binds every pod, and the figures are written against the anchor.
Timings are recorded, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).parents[4]
BENCH = ROOT / "components" / "scheduler" / "bench" / "run.py"
PODS = 4
COMPARED = (
    "classic/lj-runtimekit-scheduler",
    "DRA template/kube-scheduler",
    "DRA claim/kube-scheduler",
    "DRA extended/kube-scheduler",
    "DRA MIG claim/kube-scheduler",
    "DRA extended/lj-runtimekit-scheduler",
    "DRA share claim/kube-scheduler",
    "DRA shares/lj-runtimekit-scheduler",
)


@pytest.mark.timeout(400)
def test_dra_case_binds_every_pod_and_writes_ratios_to_the_classic_path(tmp_path: Path) -> None:
    argv = [sys.executable, str(BENCH), "--out", str(tmp_path), "--cases", "dra"]
    argv += ["--dra-nodes", "2", "--dra-pods", str(PODS), "--deadline", "120"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=360, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    figures = json.loads((tmp_path / "scheduler.json").read_text())["figures"]
    bound = {f["name"].split(":")[0]: f for f in figures if ": bound," in f["name"]}
    assert sorted(bound) == sorted(COMPARED)
    for label, f in bound.items():
        assert (f["value"], f["anchor"]) == (PODS, PODS), label
        assert f["anchor_name"] == "classic/kube-scheduler"
    for label in COMPARED:
        rate = next(f for f in figures if f["name"].startswith(f"{label}: pods/s,"))
        assert rate["value"] > 0, label
        assert rate["ratio"] is not None, label
