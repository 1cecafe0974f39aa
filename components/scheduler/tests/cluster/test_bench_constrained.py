"""The scheduler benchmark's constrained phase (issue 35: a third of the pods with required pod
anti-affinity, a third spread over racks) runs end to end at a tiny size under both schedulers,
and every pod is bound by each. Timings are recorded, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).parents[4]
BENCH = ROOT / "components" / "scheduler" / "bench" / "run.py"
PODS = 60
"""20 anti-affinity pods (2 per group: two nodes), 20 spread over the 2 racks of 16 nodes."""


@pytest.mark.timeout(600)
def test_constrained_phase_binds_every_pod_under_both_schedulers(tmp_path: Path) -> None:
    argv = [sys.executable, str(BENCH), "--out", str(tmp_path), "--cases", "classic"]
    argv += ["--nodes", "16", "--pods", "4", "--mixed", "2", "--gangs", "1", "--gang-size", "2"]
    argv += ["--constrained", str(PODS), "--clients", "5000/5000", "--deadline", "120"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=560, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    figures = json.loads((tmp_path / "scheduler.json").read_text())["figures"]
    bound = [
        f for f in figures if f["name"].startswith("pods bound,") and "constrained" in f["name"]
    ]
    assert len(bound) == 1, [f["name"] for f in figures]
    assert (bound[0]["value"], bound[0]["anchor"]) == (PODS, PODS)
    rate = next(
        f for f in figures if f["name"].startswith("pods/s,") and "constrained" in f["name"]
    )
    assert rate["value"] > 0
