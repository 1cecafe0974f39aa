"""The plugin against the real runtime simulator, through real sockets and gRPC channels."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from lj_runtimekit_device_plugin.deviceplugin.allocate import Allocator
from lj_runtimekit_device_plugin.deviceplugin.server import DevicePlugin, create_server
from lj_runtimekit_device_plugin.health import HealthFollower
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient, RuntimeUnavailable
from lj_runtimekit_device_plugin.topology import topology
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

NAMES = ResourceNames()


@dataclass
class Node:
    sim: Any
    client: RuntimeClient
    inventory: Inventory
    stubs: dict[str, api_pb2_grpc.DevicePluginAsyncStub]


@pytest_asyncio.fixture
async def node(runtime_sim: Any) -> AsyncIterator[Node]:
    client = RuntimeClient(str(runtime_sim.socket_dir), timeout=2.0)
    inventory = Inventory()
    follower = HealthFollower(client, inventory, interval_s=5.0)
    watch = asyncio.create_task(follower.watch(), name="watch")
    await asyncio.wait_for(follower.connected.wait(), 5)
    allocator = Allocator(client, NAMES, timeout_s=3.0)
    plugin_dir = Path(tempfile.mkdtemp(prefix="ljdp-"))
    servers, channels = [], []
    stubs: dict[str, api_pb2_grpc.DevicePluginAsyncStub] = {}
    for resource in (NAMES.gpu, NAMES.gpu_core, NAMES.gpu_memory):
        path = str(plugin_dir / (resource.replace("/", "-") + ".sock"))
        server = create_server(
            sockets.unix_target(path), DevicePlugin(resource, inventory, NAMES, allocator)
        )
        await server.start()
        servers.append(server)
        ch = grpc.aio.insecure_channel(sockets.unix_target(path))
        channels.append(ch)
        stubs[resource] = api_pb2_grpc.DevicePluginStub(ch)
    try:
        yield Node(runtime_sim, client, inventory, stubs)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        for ch in channels:
            await ch.close()
        for server in servers:
            await server.stop(None)
        await client.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)  # each test left one in /tmp


async def _next(call: Any, within_s: float = 5.0) -> api_pb2.ListAndWatchResponse:
    msg = await asyncio.wait_for(call.read(), within_s)
    assert isinstance(msg, api_pb2.ListAndWatchResponse), msg
    return msg


async def _first(stub: api_pb2_grpc.DevicePluginAsyncStub) -> api_pb2.ListAndWatchResponse:
    call = stub.ListAndWatch(api_pb2.Empty())
    msg = await _next(call)
    call.cancel()
    return msg


async def test_eight_gpu_node_advertises_8_gpus_800_cores_and_memory_in_gib(node: Node) -> None:
    gib = node.inventory.view().devices[0].memory_gib
    counts = {r: len((await _first(s)).devices) for r, s in node.stubs.items()}
    assert counts == {NAMES.gpu: 8, NAMES.gpu_core: 800, NAMES.gpu_memory: 8 * gib}


async def test_two_gpu_request_gets_one_nvlink_island_and_the_runtime_injection(
    node: Node,
) -> None:
    stub = node.stubs[NAMES.gpu]
    ids = [d.ID for d in (await _first(stub)).devices]
    pref = await stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=ids, allocation_size=2
                )
            ]
        )
    )
    chosen = list(pref.container_responses[0].deviceIDs)
    topo = topology(node.inventory.view().devices)
    assert len(chosen) == 2
    assert len({topo.island[i] for i in chosen}) == 1
    resp = await stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
        )
    )
    c = resp.container_responses[0]
    assert c.envs or c.annotations
    assert all(k.startswith(sockets.INJECTION_ANNOTATION_PREFIX) for k in c.annotations)
    assert len(node.sim.allocations()) == 1


async def test_unhealthy_device_leaves_the_list_within_a_second_and_comes_back(
    node: Node,
) -> None:
    call = node.stubs[NAMES.gpu].ListAndWatch(api_pb2.Empty())
    first = await _next(call)
    assert all(d.health == sockets.HEALTHY for d in first.devices)
    loop = asyncio.get_running_loop()
    start = loop.time()
    node.sim.set_health("gpu-3", False, "XID 79: GPU has fallen off the bus")
    msg = await _next(call, 1.0)
    assert loop.time() - start < 1.0
    health = {d.ID: d.health for d in msg.devices}
    assert len(health) == 8
    assert health["gpu-3"] == sockets.UNHEALTHY
    node.sim.set_health("gpu-3", True)
    msg = await _next(call, 1.0)
    assert {d.ID: d.health for d in msg.devices}["gpu-3"] == sockets.HEALTHY
    call.cancel()


async def test_runtime_restart_keeps_devices_and_recovers_the_stream(node: Node) -> None:
    await node.sim.restart()
    await asyncio.sleep(0)
    assert len(node.inventory.view().devices) == 8
    call = node.stubs[NAMES.gpu].ListAndWatch(api_pb2.Empty())
    await _next(call)
    node.sim.set_health("gpu-1", False, "after restart")
    # the reconnect waits the guide's first backoff step (1 s)
    msg = await _next(call, 5.0)
    assert {d.ID: d.health for d in msg.devices}["gpu-1"] == sockets.UNHEALTHY
    call.cancel()


async def test_failing_runtime_allocate_is_a_clear_error_not_a_crash(node: Node) -> None:
    node.sim.fail("Allocate", grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node.stubs[NAMES.gpu].Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["gpu-0"])]
            )
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "is the Runtime service running?" in (err.value.details() or "")


async def test_slow_runtime_allocate_is_bounded(node: Node) -> None:
    node.sim.fail("Allocate", None, delay_s=10.0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node.stubs[NAMES.gpu].Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["gpu-0"])]
            )
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    node.sim.clear_faults()


async def test_shared_request_without_a_pod_source_is_refused_clearly(node: Node) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node.stubs[NAMES.gpu_core].Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["gpu-0::core-0"])]
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "gpu-assignment" in (err.value.details() or "")


async def test_missing_runtime_socket_says_what_to_check(tmp_path: Path) -> None:
    client = RuntimeClient(str(tmp_path), timeout=0.5)
    with pytest.raises(RuntimeUnavailable, match="missing"):
        await client.list_devices()
    await client.close()


async def test_older_runtime_without_watch_degrades_to_periodic_checks(
    runtime_sim_factory: Any,
) -> None:
    sim = await runtime_sim_factory(
        capabilities=["DeviceService.GetVersion", "DeviceService.ListDevices"]
    )
    client = RuntimeClient(str(sim.socket_dir), timeout=2.0)
    inventory = Inventory()
    follower = HealthFollower(client, inventory, interval_s=0.1)
    await asyncio.wait_for(follower.watch(), 5)  # returns: nothing to follow
    poll = asyncio.create_task(follower.poll())
    sim.set_health("gpu-2", False, "ECC")
    deadline = asyncio.get_running_loop().time() + 2
    while inventory.view().devices[2].healthy:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    poll.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poll
    await client.close()
