"""A Runtime socket that is missing or refuses connections fails Allocate at once, naming the
socket, instead of waiting out the RPC deadline (the kubelet would retry into the same wait),
unless a restart explains it (liveness.py): then Allocate waits for the Runtime within the
deadline, so a restart rejects no pod (issue 34 item 4; the first fix, 064c5bb, failed at once
on every missing socket and the kubelet rejected the pods it admitted during Runtime restarts). A
Runtime that is there but slow still gets the deadline (test_plugin_with_runtime_sim)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from lj_runtimekit_device_plugin.deviceplugin.allocate import Allocator
from lj_runtimekit_device_plugin.deviceplugin.server import DevicePlugin, create_server
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient, RuntimeUnavailable
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

NAMES = ResourceNames()
DEADLINE_S = 2.0


@pytest.fixture(params=["missing", "refusing"])
def dead_socket_dir(request: pytest.FixtureRequest, kubelet_dir: Path) -> Path:
    """A socket directory whose device-daemon.sock is absent, or a socket file nobody serves
    (a Runtime that died without removing it)."""
    if request.param == "refusing":
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(kubelet_dir / sockets.DEVICE_SOCKET))
        stale.close()  # bound, never listening: a connect is refused
    return kubelet_dir


async def test_allocate_without_a_listening_runtime_fails_at_once_naming_the_socket(
    dead_socket_dir: Path,
) -> None:
    client = RuntimeClient(str(dead_socket_dir), timeout=DEADLINE_S)
    allocate = Allocator(client, NAMES, timeout_s=DEADLINE_S * 2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        with pytest.raises(RuntimeUnavailable) as err:
            await allocate(NAMES.gpu, [["gpu-0"]])
    finally:
        await client.close()
    took = loop.time() - start
    path = str(dead_socket_dir / sockets.DEVICE_SOCKET)
    assert f"Runtime socket {path} " in str(err.value)
    assert "is the Runtime service running?" in str(err.value)
    assert "DEADLINE_EXCEEDED" not in str(err.value), "from the pre-check, not a waited-out call"
    assert took < DEADLINE_S / 2, f"waited {took:.2f}s of the {DEADLINE_S}s deadline"


async def test_the_kubelet_is_answered_unavailable_with_the_socket_at_once(
    dead_socket_dir: Path, kubelet_dir: Path
) -> None:
    client = RuntimeClient(str(dead_socket_dir), timeout=DEADLINE_S)
    inventory = Inventory()
    await inventory.replace([Device(id="gpu-0", memory_bytes=1 << 34)])
    plugin = DevicePlugin(NAMES.gpu, inventory, NAMES, Allocator(client, NAMES, DEADLINE_S * 2))
    target = sockets.unix_target(str(kubelet_dir / "gpu.sock"))
    server = create_server(target, plugin)
    await server.start()
    channel = grpc.aio.insecure_channel(target)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await api_pb2_grpc.DevicePluginStub(channel).Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["gpu-0"])]
                ),
                timeout=DEADLINE_S / 2,  # the kubelet's wait: a waited-out call would miss it
            )
    finally:
        await channel.close()
        await server.stop(None)
        await client.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sockets.DEVICE_SOCKET in (err.value.details() or "")
