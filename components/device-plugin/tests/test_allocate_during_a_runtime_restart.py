"""A Runtime that restarts is waited for, one that is down is not (liveness.py, issue 34 item 4).

Against the runtime simulator on its real unix sockets: a Runtime seen alive a moment ago whose
socket vanishes and comes back within the deadline still gets the Allocate served (through the
kubelet's own gRPC call too); one last seen longer than ``runtime_restart_grace`` ago fails the
Allocate at once naming the socket; one that does not come back fails at the deadline, saying so.
The rule itself is checked on a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_device_plugin.deviceplugin.allocate import Allocator
from lj_runtimekit_device_plugin.deviceplugin.server import DevicePlugin, create_server
from lj_runtimekit_device_plugin.health import HealthFollower
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.liveness import Liveness
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient, RuntimeUnavailable
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

NAMES = ResourceNames()
DEADLINE_S = 2.0
#: Down longer than gRPC's first reconnect backoff (1 s +- 20 %) and shorter than the deadline:
#: a call left to the channel's own reconnects waits for the next one, at 2.4 s or later.
DOWN_S = 1.3
GRACE_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def client_of(sim: Any, **kwargs: Any) -> AsyncIterator[RuntimeClient]:
    client = RuntimeClient(str(sim.socket_dir), timeout=kwargs.pop("timeout", DEADLINE_S), **kwargs)
    try:
        yield client
    finally:
        await client.close()


async def _gone(sim: Any, client: RuntimeClient) -> None:
    """Stop the Runtime, and let the client notice as the plugin's own health poll does (its
    channel then waits out a reconnect backoff)."""
    await sim.stop()
    with pytest.raises(RuntimeUnavailable):
        await client.list_devices()


async def test_a_runtime_back_within_the_deadline_gets_the_allocate_served(
    runtime_sim: Any,
) -> None:
    async with client_of(runtime_sim) as client:
        allocate = Allocator(client, NAMES, timeout_s=DEADLINE_S * 2)
        await client.list_devices()  # seen alive
        await _gone(runtime_sim, client)
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending = asyncio.create_task(allocate(NAMES.gpu, [["gpu-0"]]))
        await asyncio.sleep(DOWN_S)  # the restart: the socket is gone this long
        assert not pending.done(), "a restart is waited for, not failed at once"
        await runtime_sim.start()
        (injection,) = await asyncio.wait_for(pending, DEADLINE_S)
        took = loop.time() - start
    assert injection.envs or injection.annotations
    assert [a.device_ids for a in runtime_sim.allocations()] == [("gpu-0",)]
    assert took < DEADLINE_S, f"served {took:.2f}s after the call, past the {DEADLINE_S}s deadline"


async def test_the_kubelets_allocate_during_a_runtime_restart_is_served(
    runtime_sim: Any, kubelet_dir: Path
) -> None:
    """As on a node: the health follower's WatchDevices stream is what saw the Runtime alive."""
    async with client_of(runtime_sim) as client:
        inventory = Inventory()
        follower = HealthFollower(client, inventory, interval_s=0.2)
        tasks = [asyncio.create_task(follower.watch()), asyncio.create_task(follower.poll())]
        await asyncio.wait_for(follower.connected.wait(), 5)
        plugin = DevicePlugin(NAMES.gpu, inventory, NAMES, Allocator(client, NAMES, DEADLINE_S * 2))
        target = sockets.unix_target(str(kubelet_dir / "gpu.sock"))
        server = create_server(target, plugin)
        await server.start()
        channel = grpc.aio.insecure_channel(target)
        try:
            await runtime_sim.stop()
            call = asyncio.ensure_future(
                api_pb2_grpc.DevicePluginStub(channel).Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["gpu-1"])]
                    ),
                    timeout=DEADLINE_S * 2,
                )
            )
            await asyncio.sleep(DOWN_S)
            assert not call.done(), "a restart is waited for, not failed at once"
            await runtime_sim.start()
            resp = await call
        finally:
            await channel.close()
            await server.stop(None)
            for t in tasks:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    (answer,) = resp.container_responses
    assert answer.envs or answer.annotations
    assert [a.device_ids for a in runtime_sim.allocations()] == [("gpu-1",)]


async def test_a_runtime_that_restarts_under_a_pending_call_is_reached_within_the_deadline(
    runtime_sim: Any,
) -> None:
    """What a call that started just before a restart sees: the socket took its connection,
    then no Runtime served it (a stand-in that accepts and hangs up) until the Runtime was back
    3.3 s later. The call, pending in gRPC, reaches it well within its 4.5 s deadline (on a
    channel that waits out gRPC's own backoff, 1 s then 2 s then 4 s, it would next dial at
    about 7 s)."""
    deadline, down = 4.5, 3.3
    path = str(Path(runtime_sim.socket_dir) / sockets.DEVICE_SOCKET)
    async with client_of(runtime_sim, timeout=deadline) as client:
        allocate = Allocator(client, NAMES, timeout_s=deadline * 2)
        await client.list_devices()
        await runtime_sim.stop()

        async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        stand_in = await asyncio.start_unix_server(hang_up, path=path)
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending = asyncio.create_task(allocate(NAMES.gpu, [["gpu-5"]]))
        await asyncio.sleep(down)
        assert not pending.done()
        stand_in.close()
        await stand_in.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a unix server leaves its socket file
        await runtime_sim.start()
        (injection,) = await asyncio.wait_for(pending, deadline)
        took = loop.time() - start
    assert injection.envs or injection.annotations
    assert [a.device_ids for a in runtime_sim.allocations()] == [("gpu-5",)]
    assert took < deadline, f"served {took:.2f}s after the call, past its {deadline}s deadline"


async def test_a_runtime_gone_longer_than_the_grace_fails_the_allocate_at_once(
    runtime_sim: Any,
) -> None:
    clock = Clock()
    async with client_of(runtime_sim, liveness=Liveness(GRACE_S, clock)) as client:
        allocate = Allocator(client, NAMES, timeout_s=DEADLINE_S * 2)
        await client.list_devices()  # seen alive, then gone for longer than the grace
        await _gone(runtime_sim, client)
        clock.now += GRACE_S + 1
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(RuntimeUnavailable) as err:
            await allocate(NAMES.gpu, [["gpu-0"]])
        took = loop.time() - start
    path = str(Path(runtime_sim.socket_dir) / sockets.DEVICE_SOCKET)
    message = str(err.value)
    assert f"Runtime socket {path} is missing" in message
    assert "last seen 31s ago" in message
    assert "runtime_restart_grace" in message
    assert took < 0.1, f"took {took:.3f}s: a Runtime that is down fails within 100 ms"
    assert runtime_sim.calls("Allocate") == 0


async def test_a_restart_that_outlasts_the_deadline_fails_at_the_deadline_saying_so(
    runtime_sim: Any,
) -> None:
    deadline = 1.0
    async with client_of(runtime_sim, timeout=deadline) as client:
        allocate = Allocator(client, NAMES, timeout_s=deadline * 3)
        await client.list_devices()
        await _gone(runtime_sim, client)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(RuntimeUnavailable) as err:
            await allocate(NAMES.gpu, [["gpu-0"]])
        took = loop.time() - start
    assert "did not take connections again within rpc_timeout (1s)" in str(err.value)
    assert sockets.DEVICE_SOCKET in str(err.value)
    assert deadline * 0.9 <= took < deadline * 2


@pytest.mark.parametrize(
    ("events", "restarting"),
    [
        ([], False),
        ([("saw", 0), ("tick", 10)], True),
        ([("saw", 0), ("tick", GRACE_S)], True),
        ([("saw", 0), ("tick", GRACE_S + 0.5)], False),
        ([("saw", 0), ("open", 0), ("tick", 3600)], True),
        ([("saw", 0), ("open", 0), ("tick", 3600), ("close", 0), ("tick", 5)], True),
        ([("open", 0), ("close", 0), ("tick", GRACE_S + 1)], False),
        ([("saw", 0), ("tick", GRACE_S + 1), ("saw", 0)], True),
    ],
    ids=[
        "never-seen",
        "seen-10s-ago",
        "seen-at-the-grace",
        "seen-past-the-grace",
        "stream-still-open",
        "stream-closed-5s-ago",
        "stream-closed-past-the-grace",
        "seen-again",
    ],
)
def test_when_a_socket_that_takes_no_connection_is_a_restart(
    events: list[tuple[str, float]], restarting: bool
) -> None:
    clock = Clock()
    live = Liveness(GRACE_S, clock)
    for what, seconds in events:
        if what == "tick":
            clock.now += seconds
        else:
            {"saw": live.saw, "open": live.stream_opened, "close": live.stream_closed}[what]()
    assert live.restarting() is restarting


def test_a_grace_of_zero_never_waits() -> None:
    live = Liveness(0.0, Clock())
    live.stream_opened()
    assert not live.restarting()
