"""`lj-cluster up` / `lj-cluster down`: the kubeconfig on the last line, no process left after."""

from __future__ import annotations

import json
import subprocess
import sys
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
