"""A process holding a control plane and a real node, interrupted: SIGTERM or Ctrl-C leave no
process, no bridge, no veth and no cgroup behind; SIGKILL leaves no process (the kernel kills the
node's PID namespace) and the bridge and empty cgroup dirs it leaves are reclaimed by the next
harness to start."""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.cluster.binaries import binaries_dir
from lj_runtimekit_testkit.cluster.processes import process_alive
from lj_runtimekit_testkit.node import host_support, node_binaries_dir
from lj_runtimekit_testkit.node.bridge import HostBridge
from lj_runtimekit_testkit.node.cgroups import hierarchies, sweep_stale

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

_HOLDER = """
import json, os, signal, sys, threading
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.node import RealNodes
cp = ControlPlane(work_dir=Path(sys.argv[1]), node_network=True)
cp.start()
node = RealNodes(cp).add(inventory="gpu-1x")
print("NODE", json.dumps({"pids": sum(node.host_pids().values(), []), "veth": node.host_veth,
      "bridge": cp.bridge.name, "cgroup": node.cgroup_root}), flush=True)
threading.Event().wait()
"""


@pytest.fixture(autouse=True)
def _can_run() -> None:
    reason = host_support()
    if reason:
        pytest.skip(reason)
    binaries_dir()
    node_binaries_dir()


def _term_with_parent() -> None:
    """In the holder: SIGTERM it (it then stops its node) if this test run dies first."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _start_holder(work_dir: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    err = work_dir / "holder.stderr"
    with err.open("w") as stderr:
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(work_dir)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=_term_with_parent,  # noqa: PLW1509 - pytest's main thread
        )
    assert holder.stdout is not None
    line = holder.stdout.readline()
    while line and not line.startswith("NODE "):  # structlog writes to stdout too
        line = holder.stdout.readline()
    if not line:
        # reaped and closed here: a holder left behind would be reported against a later test
        with holder:
            holder.kill()
        tail = err.read_text()[-3000:]
        raise AssertionError(f"the holder exited before its node was Ready; its stderr:\n{tail}")
    info: dict[str, Any] = json.loads(line.removeprefix("NODE "))
    return holder, info


def _left(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "processes": [p for p in info["pids"] if process_alive(p)],
        "links": [
            n for n in (info["veth"], info["bridge"]) if Path(f"/sys/class/net/{n}").exists()
        ],
        "cgroups": [
            str(m / info["cgroup"]) for m in hierarchies() if (m / info["cgroup"]).exists()
        ],
    }


def _wait_gone(info: dict[str, Any], key: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while _left(info)[key] and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_an_interrupted_holder_leaves_nothing_of_its_node(
    sig: signal.Signals, tmp_path: Path
) -> None:
    holder, info = _start_holder(tmp_path)
    with holder:
        try:
            assert info["pids"]
            assert all(_left(info).values())  # everything exists while it runs
            holder.send_signal(sig)
            holder.wait(timeout=120)
        finally:
            holder.kill()
    assert _left(info) == {"processes": [], "links": [], "cgroups": []}


def test_a_killed_holder_leaves_no_process_and_its_leftovers_are_reclaimed(
    tmp_path: Path,
) -> None:
    holder, info = _start_holder(tmp_path)
    with holder:
        holder.kill()
        holder.wait()
    _wait_gone(info, "processes")
    assert _left(info)["processes"] == []
    # The veth died with the node's network namespace; the bridge and the empty cgroup dirs
    # stay until a harness finds their owner gone.
    veth = Path(f"/sys/class/net/{info['veth']}")
    deadline = time.monotonic() + 10.0
    while veth.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sweep_stale()
    bridge = HostBridge.claim()
    bridge.release()
    assert _left(info) == {"processes": [], "links": [], "cgroups": []}
