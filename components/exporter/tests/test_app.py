"""The process: a start that cannot work exits with a clear error instead of serving nothing."""

from __future__ import annotations

import socket
from pathlib import Path

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
