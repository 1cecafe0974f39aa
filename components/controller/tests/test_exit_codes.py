"""The controller as a process (issue 19): fatal errors exit non-zero with what to fix; an
unreachable apiserver is served through and shown in /healthz; one signal stops it cleanly (0),
a second forces exit 130 — the code every daemon of the suite uses."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lj_runtimekit_controller import __main__

UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(UNREACHABLE_KUBECONFIG)
    return str(path)


def controller(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LJ_RUNTIMEKIT_CONTROLLER_")}
    return subprocess.Popen(
        [sys.executable, "-m", "lj_runtimekit_controller", "--job-image=agent:test", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "LJ_RUNTIMEKIT_CONTROLLER_LOG_FORMAT": "json"},
    )


def finished(*args: str) -> tuple[int, str]:
    proc = controller(*args)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ("version: v1\n1: x\n", "unknown keys ['1']"),
        ("version: v1\njob_image: [a, b]\n", "job_image=['a', 'b']"),
        ("version: v1\napi_qps: .inf\n", "api_qps inf"),
        ("version: v1\nretry_backoff: .nan\n", "retry_backoff nan"),
        ("version: v1\nconcurrency: 2.5\n", "concurrency=2.5"),
        ("version: v1\nleader_elect: maybe\n", "leader_elect='maybe'"),
        ("version: v9\n", "version 'v9' unknown"),
        ("- a list\n", "expected a mapping"),
    ],
    ids=["numeric-key", "list", "inf", "nan", "float-int", "bool", "version", "list-doc"],
)
def test_a_bad_config_file_exits_2_naming_the_key(
    tmp_path: Path, config: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process (the same main() the console script runs): a process per case costs seconds.
    path = tmp_path / "config.yaml"
    path.write_text(config)
    assert __main__.main(["--job-image=agent:test", "--config", str(path)]) == 2
    assert named in capsys.readouterr().err


def test_a_port_in_use_exits_non_zero_naming_it(kubeconfig: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # v1.13's --port still works (with a deprecation warning) and names the port
        code, out = finished(f"--kubeconfig={kubeconfig}", "--leader-elect=false", f"--port={port}")
    assert code == 1, out
    assert f":{port}" in out
    assert "flag --port is deprecated: use --metrics-bind-address" in out
    assert "Traceback" not in out


@pytest.fixture
def running(kubeconfig: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = controller(
        f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--metrics-bind-address=127.0.0.1:0"
    )
    assert proc.stdout is not None
    lines: list[str] = []
    port = 0
    deadline = time.monotonic() + 60
    while not port and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "serving" in line and (m := re.search(r"\bport\W{1,3}(\d+)", line)):
            port = int(m.group(1))
    assert port, "".join(lines)
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def healthz(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_an_unreachable_apiserver_is_served_through_and_shown_in_healthz(
    running: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = running
    deadline = time.monotonic() + 30
    status, body = healthz(port)
    while "degraded" not in body and time.monotonic() < deadline:
        time.sleep(0.2)
        status, body = healthz(port)
    assert status == 200
    assert "degraded: nodes list/watch failing" in body
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_second_signal_forces_exit_130(running: tuple[subprocess.Popen[str], int]) -> None:
    proc, _ = running
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130


def test_the_health_probe_address_serves_healthz_too(kubeconfig: str) -> None:
    with socket.socket() as s:  # a free port for the probe server (released before the start)
        s.bind(("127.0.0.1", 0))
        probe_port = s.getsockname()[1]
    proc = controller(
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--metrics-bind-address=127.0.0.1:0",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # until it serves (or ends: the loop then ends too)
            if "serving" in line:
                break
        status, body = healthz(probe_port)
        assert status == 200, body
        assert body.startswith("ok"), body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
