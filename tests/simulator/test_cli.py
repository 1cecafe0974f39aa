"""``lj-runtime-sim`` as a process: serves, takes faults over control.sock, cleans up on SIGTERM."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
import pytest_asyncio

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_interface.runtime.v1 import device_pb2_grpc as dgrpc

SOCKET_NAMES = {
    sockets.DEVICE_SOCKET,
    sockets.MONITOR_SOCKET,
    sockets.CONFIG_SOCKET,
    "control.sock",
}


async def _until(check: object, deadline_s: float = 10.0) -> None:
    assert callable(check)
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, "condition not met before the deadline"
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def sim_process() -> AsyncIterator[tuple[asyncio.subprocess.Process, Path]]:
    socket_dir = Path(tempfile.mkdtemp(prefix="ljsim-cli-"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lj_runtimekit_testkit.simulator",
        "--socket-dir",
        str(socket_dir),
        "--inventory",
        "mig-tdm",
        "--node",
        "cli-node",
        "--log-format",
        "json",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await _until(lambda: {p.name for p in socket_dir.iterdir()} >= SOCKET_NAMES)
        yield proc, socket_dir
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        shutil.rmtree(socket_dir, ignore_errors=True)


async def test_cli_serves_takes_faults_and_cleans_up_on_sigterm(
    sim_process: tuple[asyncio.subprocess.Process, Path],
) -> None:
    proc, socket_dir = sim_process
    target = sockets.unix_target(str(socket_dir / sockets.DEVICE_SOCKET))
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dgrpc.DeviceServiceStub(channel)
        devices = (await stub.ListDevices(pb.ListDevicesRequest())).devices
        assert len(devices) == 4
        stream = stub.WatchDevices(pb.WatchDevicesRequest())
        await asyncio.wait_for(stream.read(), 2.0)
        connector = aiohttp.UnixConnector(path=str(socket_dir / "control.sock"))
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.post(
                "http://sim/health", json={"device": "gpu-3", "healthy": False, "reason": "XID 79"}
            ) as r:
                assert r.status == 200
            event = await asyncio.wait_for(stream.read(), 1.0)
            assert isinstance(event, pb.WatchDevicesResponse)
            assert event.type == pb.DEVICE_EVENT_TYPE_HEALTH_CHANGED
            async with http.post(
                "http://sim/fail", json={"method": "GetVersion", "code": "INTERNAL"}
            ) as r:
                assert r.status == 200
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetVersion(pb.GetVersionRequest())
            assert err.value.code() == grpc.StatusCode.INTERNAL
            async with http.post("http://sim/fail", json={"method": "nope", "code": None}) as r:
                assert r.status == 400
                assert "unknown Runtime method" in (await r.json())["error"]
            async with http.get("http://sim/state") as r:
                state = await r.json()
            assert state["node"] == "cli-node"
            assert state["devices"]["gpu-3"]["healthy"] is False
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10.0) == 0
    assert not SOCKET_NAMES & {p.name for p in socket_dir.iterdir()}


async def test_cli_refuses_a_missing_inventory_clearly(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lj_runtimekit_testkit.simulator",
        "--socket-dir",
        str(tmp_path),
        "--inventory",
        "no-such-node",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20.0)
    assert proc.returncode == 2
    assert b"no-such-node" in err
    assert b"cannot read" in err


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from lj_runtimekit_testkit.simulator.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--socket-dir",
        "--inventory",
        "--node",
        "--state-file",
        "--capabilities",
        "--log-format",
        "control.sock",
    ):
        assert flag in out
