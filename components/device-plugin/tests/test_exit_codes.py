"""The daemon as the DaemonSet runs it (``python -m``): every fatal error exits non-zero.

Exit 0 shows as "Completed" in CrashLoopBackOff and misleads triage; a signal is the only
clean end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lj_runtimekit_device_plugin.__main__ import main
from lj_runtimekit_interface.runtime.v1 import device_pb2
from lj_runtimekit_testkit.hostile_runtime import HostileRuntime, socket_dir, version_reply

GIB = 1 << 30


@pytest.fixture
async def runtime() -> AsyncIterator[HostileRuntime]:
    with socket_dir() as d:
        h = HostileRuntime(d)
        h.answer("GetVersion", version_reply())
        h.answer(
            "ListDevices",
            device_pb2.ListDevicesResponse(
                devices=[device_pb2.Device(id="gpu-0", memory_bytes=8 * GIB)]
            ),
        )
        await h.start()
        try:
            yield h
        finally:
            await h.stop()


async def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lj_runtimekit_device_plugin",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={
            **os.environ,
            "NODE_NAME": "n1",
            "LJ_RUNTIMEKIT_DEVICE_PLUGIN_LOG_FORMAT": "json",
            **(env or {}),
        },
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"the daemon did not exit: {out.decode(errors='replace')[-2000:]}")
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_bad_settings_exit_2_naming_key_and_value() -> None:
    code, out = await _run(env={"LJ_RUNTIMEKIT_DEVICE_PLUGIN_RPC_TIMEOUT": "soon"})
    assert code == 2, out
    assert "RPC_TIMEOUT: rpc_timeout='soon'" in out, out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--health-interval", "-1"], "health_interval -1.0"),
        (["--port", "70000"], "port 70000"),
        (["--config", "/nonexistent/config.yaml"], "config file /nonexistent/config.yaml"),
    ],
    ids=["negative", "port", "missing-file"],
)
def test_more_bad_settings_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the same path in-process (a subprocess each costs seconds): main's exit code
    assert main([*args, "--node-name", "n1"]) == 2
    assert message in capsys.readouterr().err


async def test_a_port_in_use_exits_1_saying_which(runtime: HostileRuntime) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = await _run(
            "--socket-dir", str(runtime.socket_dir), "--listen-address", "127.0.0.1",
            "--port", str(port), "--kubeconfig", "/nonexistent",
        )  # fmt: skip
    assert code == 1, out
    assert "device_plugin_not_started" in out, out
    assert str(port) in out, out
    # v1.13's --listen-address/--port still work, each with a warning naming the new flag
    assert "flag --port is deprecated: use --metrics-bind-address" in out, out


async def test_a_fatal_task_failure_exits_1_not_0(
    runtime: HostileRuntime, kubelet_dir: Path
) -> None:
    # the kubelet's directory is missing (hostPath not mounted): the plugins task cannot bind
    # its sockets and ends; the daemon must stop with a failure, not "Completed"
    missing = kubelet_dir / "not-there"
    code, out = await _run(
        "--socket-dir", str(runtime.socket_dir), "--plugin-dir", str(missing),
        "--port", "0", "--listen-address", "127.0.0.1", "--kubeconfig", "/nonexistent",
        "--publish-inventory", "false",
    )  # fmt: skip
    assert code == 1, out
    assert "device_plugin_failed" in out, out
    assert "plugins" in out, out


async def test_sigterm_is_a_clean_exit_0(runtime: HostileRuntime, kubelet_dir: Path) -> None:
    plugin_dir = kubelet_dir
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lj_runtimekit_device_plugin",
        "--socket-dir", str(runtime.socket_dir), "--plugin-dir", str(plugin_dir),
        "--port", "0", "--listen-address", "127.0.0.1", "--kubeconfig", "/nonexistent",
        "--publish-inventory", "false", "--log-format", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NODE_NAME": "n1"},
    )  # fmt: skip
    assert proc.stdout is not None
    # started: the first inventory arrived (the plugins then wait for a kubelet)
    while b"device_added" not in (line := await asyncio.wait_for(proc.stdout.readline(), 60)):
        assert line, "the daemon ended before serving"
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
