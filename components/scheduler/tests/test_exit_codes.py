"""The scheduler as a process (issue 19): every fatal error exits non-zero with a message naming
what to fix; an unreachable apiserver is served through and shown in /healthz; one signal stops it
cleanly (0), a second forces exit 130 — the code every daemon of the suite uses."""

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

from lj_runtimekit_scheduler import __main__

UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def scheduler(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lj_runtimekit_scheduler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "LJ_SCHEDULER_LOG_LEVEL": "info"},
    )


def finished(*args: str) -> tuple[int, str]:
    proc = scheduler(*args)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(UNREACHABLE_KUBECONFIG)
    return str(path)


BAD_CONFIGS = [
    ("version: v1\ngangTimeoutSeconds: .nan\n", "gangTimeoutSeconds"),
    ("version: v1\nassumeTTLSeconds: true\n", "assumeTTLSeconds"),
    ("version: v1\n1: x\n", "unknown keys ['1']"),
    ("version: v2\n", "unknown config version"),
    ("[not, a, mapping]\n", "expected a mapping"),
    ("version: v1\nplugins: {GpuFit: 2}\n", "plugins must be a list"),
    ("version: v1\nresource_gpu: nodomain\n", "resource_gpu"),
    ("\x00\x01 binary", "cannot read config file"),
]
BAD_IDS = ["nan", "bool-as-number", "numeric-key", "version", "not-mapping", "plugins", "resource"]


@pytest.mark.parametrize(("config", "named"), BAD_CONFIGS, ids=[*BAD_IDS, "binary"])
def test_a_bad_config_file_exits_2_naming_the_key(
    tmp_path: Path, kubeconfig: str, config: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process (the same main() the console script runs): a process per case costs seconds.
    path = tmp_path / "config.yaml"
    path.write_text(config)
    assert __main__.main(["--config", str(path), "--kubeconfig", kubeconfig]) == 2
    assert named in capsys.readouterr().err


def test_a_bad_config_file_exits_2_as_a_process(tmp_path: Path, kubeconfig: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BAD_CONFIGS[0][0])
    code, out = finished("--config", str(path), "--kubeconfig", kubeconfig)
    assert code == 2, out
    assert "gangTimeoutSeconds" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--qps", "-1"], "qps"),
        (["--burst", "0"], "burst"),
        (["--metrics-port", "70000"], "metrics_port"),
    ],
    ids=["qps", "burst", "port"],
)
def test_a_bad_flag_exits_2_naming_it(
    kubeconfig: str, flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert __main__.main([*flags, "--kubeconfig", kubeconfig]) == 2
    assert named in capsys.readouterr().err


def test_a_missing_kubeconfig_exits_2(tmp_path: Path) -> None:
    code, out = finished("--kubeconfig", str(tmp_path / "nope"), "--no-leader-elect")
    assert code == 2, out
    assert "kubeconfig" in out


def test_a_metrics_port_in_use_exits_2_naming_it(kubeconfig: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = finished(
            "--kubeconfig", kubeconfig, "--no-leader-elect", "--metrics-port", str(port)
        )
    assert code == 2, out
    assert f"port {port}" in out
    assert "Traceback" not in out


@pytest.fixture
def running(kubeconfig: str) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    proc = scheduler("--kubeconfig", kubeconfig, "--no-leader-elect", "--metrics-port", "0")
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
        yield proc, port, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def healthz(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_an_unreachable_apiserver_is_served_through_and_shown_in_healthz(
    running: tuple[subprocess.Popen[str], int, list[str]],
) -> None:
    proc, port, _ = running
    deadline = time.monotonic() + 30
    status, body = healthz(port)
    while "degraded" not in body and time.monotonic() < deadline:
        time.sleep(0.2)
        status, body = healthz(port)
    assert status == 200
    assert "degraded: pods list/watch failing" in body
    assert "apiserver unreachable" in body
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_second_signal_forces_exit_130(
    running: tuple[subprocess.Popen[str], int, list[str]],
) -> None:
    proc, _, _ = running
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
