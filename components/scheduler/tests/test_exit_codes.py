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


def scheduler(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lj_runtimekit_scheduler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "LJ_RUNTIMEKIT_SCHEDULER_LOG_LEVEL": "info", **(env or {})},
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
    ("version: v1\ngang_timeout: .nan\n", "gang_timeout"),
    ("version: v1\nassumeTTLSeconds: true\n", "assumeTTLSeconds"),
    ("version: v1\n1: x\n", "unknown keys ['1']"),
    ("version: v2\n", "version 'v2' unknown"),
    ("[not, a, mapping]\n", "expected a mapping"),
    ("version: v1\nplugins: {GpuFit: 2}\n", "plugins must be a list"),
    ("version: v1\nresource_gpu: nodomain\n", "resource_gpu"),
    ("\x00\x01 binary", "is not valid YAML"),
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
    assert "gang_timeout" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--kube-api-qps", "-1"], "kube_api_qps"),
        (["--kube-api-burst", "0"], "kube_api_burst"),
        (["--metrics-bind-address", ":70000"], "metrics_bind_address"),
        (["--leader-elect-renew-deadline", "20"], "renew deadline < lease duration"),
        (["--qps", "-1"], "kube_api_qps"),
        (["--metrics-port", "70000"], "metrics_bind_address"),
    ],
    ids=["qps", "burst", "port", "renew-deadline", "old-qps", "old-port"],
)
def test_a_bad_flag_exits_2_naming_it(
    kubeconfig: str, flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert __main__.main([*flags, "--kubeconfig", kubeconfig]) == 2
    assert named in capsys.readouterr().err


def test_a_missing_kubeconfig_exits_2(tmp_path: Path) -> None:
    code, out = finished("--kubeconfig", str(tmp_path / "nope"), "--leader-elect=false")
    assert code == 2, out
    assert "kubeconfig" in out


def test_a_metrics_port_in_use_exits_1_naming_it(kubeconfig: str) -> None:
    # 1, not 2: the settings are right, the machine is not (docs/shape.md, exit codes)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = finished(
            "--kubeconfig", kubeconfig, "--leader-elect=false", "--metrics-bind-address", f":{port}"
        )
    assert code == 1, out
    assert f"cannot serve on :{port}" in out
    assert "address already in use" in out
    assert "Traceback" not in out


@pytest.fixture
def running(kubeconfig: str) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    proc = scheduler(
        "--kubeconfig", kubeconfig, "--leader-elect=false", "--metrics-bind-address", "127.0.0.1:0"
    )
    yield from serving(proc)


def serving(proc: subprocess.Popen[str]) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
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
    # the three informers fail in any order, and /healthz lists them in the order they failed
    while "pods list/watch failing" not in body and time.monotonic() < deadline:
        time.sleep(0.2)
        status, body = healthz(port)
    assert status == 200
    assert body.startswith("ok\ndegraded: ")
    assert "pods list/watch failing" in body
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


def test_v1_13_spellings_start_it_with_a_warning_for_each(kubeconfig: str) -> None:
    old = scheduler(
        "--kubeconfig", kubeconfig, "--no-leader-elect", "--metrics-port", "0",
        env={"LJ_SCHEDULER_NAME": "old-env-name"},
    )  # fmt: skip
    for proc, port, lines in serving(old):
        text = "".join(lines)
        for spelling, new in (
            ("flag --no-leader-elect", "--leader-elect"),
            ("flag --metrics-port", "--metrics-bind-address"),
            ("environment LJ_SCHEDULER_NAME", "LJ_RUNTIMEKIT_SCHEDULER_SCHEDULER_NAME"),
        ):
            assert f"{spelling} is deprecated: use {new}" in text, text
        assert '"scheduler_name": "old-env-name"' in text
        assert '"leader_elect": false' in text
        assert healthz(port)[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_lease_timings_are_not_checked_without_leader_election(kubeconfig: str) -> None:
    # kube-scheduler validates leaderElection only when it is on; so do we (no elector is built)
    proc = scheduler(
        "--kubeconfig", kubeconfig, "--leader-elect=false", "--metrics-bind-address",
        "127.0.0.1:0", "--leader-elect-renew-deadline", "20",
    )  # fmt: skip
    for running, port, _ in serving(proc):
        assert healthz(port)[0] == 200
        running.send_signal(signal.SIGTERM)
        assert running.wait(timeout=30) == 0
