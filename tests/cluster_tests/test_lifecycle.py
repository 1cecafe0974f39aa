"""`lj-cluster up` / `lj-cluster down`: the kubeconfig on the last line, no process left after."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from lj_runtimekit_testkit.cluster.binaries import binaries_dir
from lj_runtimekit_testkit.cluster.processes import group_alive, process_alive

pytestmark = pytest.mark.cluster


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "lj_runtimekit_testkit.cluster", "--state-dir", str(state_dir)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=180, check=False)


def test_up_prints_kubeconfig_and_down_leaves_no_process(tmp_path: Path) -> None:
    binaries_dir()
    up = _cli(tmp_path, "up", "--nodes", "3")
    assert up.returncode == 0, up.stderr
    kubeconfig = up.stdout.strip().splitlines()[-1]
    state = json.loads((tmp_path / "state.json").read_text())
    try:
        with config.new_client_from_config(config_file=kubeconfig) as api:  # type: ignore[no-untyped-call]
            nodes = client.CoreV1Api(api).list_node(label_selector="lj_runtimekit_enable=true")
            assert len(nodes.items) == 3
    finally:
        down = _cli(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    left = [pid for pid in state["pids"] if group_alive(pid)]
    assert not process_alive(state["pid"])
    assert left == []
    assert not (tmp_path / "state.json").exists()


# The holder restores Ctrl-C's default: a test run started in the background (`make test &`,
# nohup, some CI runners) hands its children SIGINT ignored, and Python keeps an inherited ignore.
_HOLDER = """
import json, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
cp = ControlPlane(work_dir=Path(sys.argv[1])) if len(sys.argv) > 1 else ControlPlane()
cp.start()
print("WORK", cp.work_dir, flush=True)
print("PIDS", json.dumps(cp.pids()), flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_interrupted_holder_leaves_no_process(sig: signal.Signals) -> None:
    binaries_dir()
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            work = ""
            while line and not line.startswith("PIDS "):  # structlog writes to stdout too
                work = line.removeprefix("WORK ").strip() if line.startswith("WORK ") else work
                line = holder.stdout.readline()
            pids = json.loads(line.removeprefix("PIDS "))
            assert len(pids) == 5
            assert all(group_alive(p) for p in pids)
            assert Path(work).is_dir()
            holder.send_signal(sig)
            holder.wait(timeout=60)
            assert [p for p in pids if group_alive(p)] == []
            # the temp dir it made for itself goes too
            assert not Path(work).exists()
        finally:
            holder.kill()


def test_killed_holder_leaves_no_process(tmp_path: Path) -> None:
    binaries_dir()
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "work")],  # SIGKILL: nothing cleans up
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        while line and not line.startswith("PIDS "):
            line = holder.stdout.readline()
        pids = json.loads(line.removeprefix("PIDS "))
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if process_alive(p)] == []
