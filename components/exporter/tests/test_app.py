"""The process: a start that cannot work exits with a clear error instead of serving nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lj_runtimekit_exporter import app
from lj_runtimekit_exporter.__main__ import main
from lj_runtimekit_exporter.settings import Settings


def test_a_missing_kubeconfig_for_the_apiserver_source_exits_2(tmp_path: Path) -> None:
    settings = Settings(
        node_name="n",
        socket_dir=str(tmp_path),
        metrics_bind_address="127.0.0.1:0",
        pods_source="apiserver",
        kubeconfig=str(tmp_path / "missing.kubeconfig"),
        log_format="text",
    )
    assert app.run(settings) == 2


def test_a_taken_port_exits_1(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        settings = Settings(
            node_name="n",
            socket_dir=str(tmp_path),
            metrics_bind_address=f"127.0.0.1:{port}",
            pods_source="none",
            log_format="text",
        )
        assert app.run(settings) == 1


def test_bad_flags_exit_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pods-source", "dns"]) == 2
    assert "pods_source 'dns'" in capsys.readouterr().err


async def test_the_health_probe_bind_address_serves_healthz(
    exporter_factory: Callable[..., Awaitable[Any]], tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        probe = s.getsockname()[1]
    await exporter_factory(socket_dir=str(tmp_path), health_probe_bind_address=f"127.0.0.1:{probe}")
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{probe}/healthz") as r:
        assert r.status in (200, 503)  # answered: the poll loop's state, not a refused connection
        assert (await r.text()).strip()


def test_old_flag_spellings_still_start_and_warn(tmp_path: Path) -> None:
    # v1.13's --listen-address/--port: the manifests of an operator upgrading keep working. A
    # process of its own: app.run configures logging to the stderr it finds, which a capture
    # fixture would close under the tests that follow
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        argv = ["--listen-address", "127.0.0.1", "--port", str(port), "--log-format", "json"]
        argv += ["--socket-dir", str(tmp_path), "--pods-source", "none", "--node-name", "n"]
        proc = subprocess.run(
            [sys.executable, "-m", "lj_runtimekit_exporter", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 1, proc.stderr
    assert "deprecated_setting" in proc.stderr
    assert "flag --port is deprecated: use --metrics-bind-address" in proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr  # the port in use is named with the new spelling
