"""A Runtime that answers garbage, hangs, or lies: the plugin survives, says so, and stays bounded.

The misbehaving Runtime is the testkit's :mod:`hostile_runtime` (real service and method names,
any bytes as the answer) on real unix sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from lj_runtimekit_device_plugin import runtime
from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.deviceplugin.assignment import ALLOCATION, ASSIGNMENT
from lj_runtimekit_device_plugin.deviceplugin.handshake import SharedHandshake
from lj_runtimekit_device_plugin.errors import PermanentError
from lj_runtimekit_device_plugin.kubelet import PodResourcesClient, PodResourcesUnavailable
from lj_runtimekit_device_plugin.lifecycle import Tasks
from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.podview import PodView
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient, RuntimeGarbage, RuntimeUnavailable
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.runtime.v1 import device_pb2
from lj_runtimekit_testkit.hostile_runtime import (
    NOT_PROTOBUF,
    HostileRuntime,
    non_utf8_string_field,
    serve_bytes,
    socket_dir,
    version_reply,
)

GIB = 1 << 30


def gpus(n: int = 2) -> device_pb2.ListDevicesResponse:
    return device_pb2.ListDevicesResponse(
        devices=[
            device_pb2.Device(
                id=f"gpu-{i}",
                index=i,
                kind=device_pb2.DEVICE_KIND_GPU,
                memory_bytes=16 * GIB,
                health=device_pb2.Health(state=device_pb2.HEALTH_STATE_HEALTHY),
            )
            for i in range(n)
        ]
    )


@pytest.fixture
async def hostile() -> AsyncIterator[HostileRuntime]:
    with socket_dir() as d:
        h = HostileRuntime(d)
        await h.start()
        try:
            yield h
        finally:
            await h.stop()


#: where each reply has a string: GetVersion's version, else the first device's or allocation's id
STRING_AT = {"GetVersion": (1,), "WatchDevices": (2, 1)}


async def _drain(client: RuntimeClient, into: list[object]) -> None:
    async for ev in client.watch():
        into.append(ev)


async def _call(client: RuntimeClient, method: str) -> object:
    if method == "GetVersion":
        return await client.version()
    if method == "ListDevices":
        return await client.list_devices()
    if method == "WatchDevices":
        return [x async for x in client.watch()]
    if method == "Allocate":
        return await client.allocate(
            pod=("ns", "p", "u"), container="c", resource="r", device_ids=["gpu-0"]
        )
    if method == "Release":
        return await runtime.release(client, "a-1")
    if method == "ListAllocations":
        return await runtime.allocations(client)
    return await runtime.update_owner(client, "a-1", ("ns", "p", "u"), "c")


METHODS = [
    "GetVersion",
    "ListDevices",
    "WatchDevices",
    "Allocate",
    "Release",
    "ListAllocations",
    "UpdateAllocationOwner",
]


@pytest.mark.parametrize(
    ("method", "garbage"),
    [(m, "not-protobuf") for m in METHODS]
    # ReleaseResponse has no string field to hold non-UTF-8
    + [(m, "non-utf8-string") for m in METHODS if m != "Release"],
)
async def test_a_reply_that_does_not_parse_is_a_clear_error_naming_the_method(
    hostile: HostileRuntime, method: str, garbage: str
) -> None:
    bad = NOT_PROTOBUF
    if garbage == "non-utf8-string":
        bad = non_utf8_string_field(*STRING_AT.get(method, (1, 1)))
    hostile.answer(method, bad)
    told: list[str] = []
    client = RuntimeClient(str(hostile.socket_dir), 5.0, on_garbage=told.append)
    try:
        with pytest.raises(RuntimeGarbage, match=f"DeviceService.{method} on .* not a valid reply"):
            await _call(client, method)
    finally:
        await client.close()
    assert told == [method]


@pytest.mark.parametrize("method", METHODS)
async def test_a_hanging_runtime_call_ends_with_a_clear_error(
    hostile: HostileRuntime, method: str
) -> None:
    if method == "WatchDevices":
        # a stream is long-lived by design; one that hangs *before* its snapshot is bounded by
        # the periodic ListDevices instead (test below)
        hostile.answer(method, abort=grpc.StatusCode.INTERNAL, hang=False)
    else:
        hostile.answer(method, hang=True)
    client = RuntimeClient(str(hostile.socket_dir), 0.3)
    try:
        with pytest.raises(RuntimeUnavailable, match=method):
            await _call(client, method)
    finally:
        await client.close()


async def test_a_stream_that_breaks_midway_is_a_clear_error(hostile: HostileRuntime) -> None:
    snapshot = device_pb2.WatchDevicesResponse(
        type=device_pb2.DEVICE_EVENT_TYPE_SNAPSHOT, devices=gpus().devices
    )
    for tail, error in ((NOT_PROTOBUF, RuntimeGarbage), (None, RuntimeUnavailable)):
        replies = [snapshot, tail] if tail is not None else [snapshot]
        hostile.answer("WatchDevices", *replies)
        client = RuntimeClient(str(hostile.socket_dir), 1.0)
        got: list[object] = []
        try:
            with pytest.raises(error, match="WatchDevices"):
                await _drain(client, got)
        finally:
            await client.close()
        assert [ev[0] for ev in got] == ["snapshot"]  # type: ignore[index]


class Registrar(api_pb2_grpc.RegistrationServicer):
    """The kubelet's Registration: refuses each resource in ``refuse`` that many times first."""

    def __init__(self, refuse: dict[str, int] | None = None) -> None:
        self.refuse = dict(refuse or {})
        self.ok: list[str] = []
        self.refused: list[str] = []

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        if self.refuse.get(request.resource_name, 0) > 0:
            self.refuse[request.resource_name] -= 1
            self.refused.append(request.resource_name)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused by the test kubelet")
        self.ok.append(request.resource_name)
        return api_pb2.Empty()


@contextlib.asynccontextmanager
async def kubelet(reg: Registrar) -> AsyncIterator[Path]:
    plugin_dir = Path(tempfile.mkdtemp(prefix="ljkub-"))
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(reg, server)
    server.add_insecure_port(sockets.unix_target(str(plugin_dir / sockets.KUBELET_SOCKET)))
    await server.start()
    try:
        yield plugin_dir
    finally:
        await server.stop(None)
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def _until(cond: Any, within_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def daemon(
    hostile: HostileRuntime, plugin_dir: Path
) -> AsyncIterator[tuple[str, Tasks, asyncio.Task[None]]]:
    s = load(
        [
            "--socket-dir",
            str(hostile.socket_dir),
            "--plugin-dir",
            str(plugin_dir),
            "--port",
            "0",
            "--listen-address",
            "127.0.0.1",
            "--node-name",
            "n1",
            "--rpc-timeout",
            "0.5",
            "--health-interval",
            "0.2",
            "--resources",
            "gpu,gpu-core",
            "--publish-inventory",
            "false",
            "--kubeconfig",
            "/nonexistent",
            "--log-format",
            "console",
        ],
        {},
    )
    stop = Tasks()
    port: list[int] = []
    task = asyncio.create_task(serve(s, stop, bound=port.append))
    try:
        await _until(lambda: bool(port) or task.done())
        assert not task.done(), task
        yield f"http://127.0.0.1:{port[0]}", stop, task
    finally:
        stop.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.text()


async def test_plugin_survives_garbage_keeps_its_devices_and_says_so(
    hostile: HostileRuntime,
) -> None:
    hostile.answer("GetVersion", version_reply())
    hostile.answer("ListDevices", gpus())
    hostile.answer(
        "WatchDevices",
        device_pb2.WatchDevicesResponse(
            type=device_pb2.DEVICE_EVENT_TYPE_SNAPSHOT, devices=gpus().devices
        ),
        NOT_PROTOBUF,
    )
    reg = Registrar()
    async with kubelet(reg) as plugin_dir, daemon(hostile, plugin_dir) as (url, stop, task):
        await _until(lambda: {"aliyun.com/gpu", "aliyun.com/gpu-core"} <= set(reg.ok))
        # from now on every answer is garbage
        hostile.answer("ListDevices", NOT_PROTOBUF)
        hostile.answer("GetVersion", NOT_PROTOBUF)
        await _until(lambda: hostile.calls("GetVersion") >= 4)
        status, text = await _get(url + "/healthz")
        assert not task.done()
        assert not stop.fatal
        assert status == 200, text
        assert "degraded" in text, text
        assert "not a valid reply" in text, text
        _, metrics = await _get(url + "/metrics")
        assert 'lj_device_plugin_runtime_invalid_replies_total{method="GetVersion"}' in metrics
        # the kubelet still gets the last known devices
        sock = plugin_dir / "lj-aliyun.com-gpu.sock"
        async with grpc.aio.insecure_channel(sockets.unix_target(str(sock))) as ch:
            stream = api_pb2_grpc.DevicePluginStub(ch).ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            stream.cancel()
        assert isinstance(first, api_pb2.ListAndWatchResponse)
        assert sorted(d.ID for d in first.devices) == ["gpu-0", "gpu-1"]


async def test_plugin_facing_garbage_from_the_start_stays_up_and_names_the_method(
    hostile: HostileRuntime,
) -> None:
    hostile.answer("GetVersion", NOT_PROTOBUF)
    reg = Registrar()
    async with kubelet(reg) as plugin_dir, daemon(hostile, plugin_dir) as (url, stop, task):
        await _until(lambda: hostile.calls("GetVersion") >= 2)
        status, text = await _get(url + "/healthz")
        assert status == 503
        assert "DeviceService.GetVersion" in text, text
        assert "not a valid reply" in text, text
        assert not task.done()
        assert not stop.fatal
        # and it recovers without a restart once the Runtime answers sanely
        hostile.answer("GetVersion", version_reply())
        hostile.answer("ListDevices", gpus())
        await _until(lambda: "aliyun.com/gpu" in reg.ok)


async def test_a_refused_registration_is_retried_while_others_stay_registered(
    hostile: HostileRuntime,
) -> None:
    hostile.answer("GetVersion", version_reply())
    hostile.answer("ListDevices", gpus())
    reg = Registrar(refuse={"aliyun.com/gpu-core": 2})
    async with kubelet(reg) as plugin_dir, daemon(hostile, plugin_dir) as (url, _, _task):
        await _until(lambda: "aliyun.com/gpu" in reg.ok and reg.refused)
        status, text = await _get(url + "/healthz")
        if "aliyun.com/gpu-core" not in reg.ok:
            assert "aliyun.com/gpu-core not registered" in text, text
            # the alert LJRuntimeKitDevicePluginNotRegistered reads this gauge
            _, metrics = await _get(url + "/metrics")
            if "aliyun.com/gpu-core" not in reg.ok:
                assert 'lj_device_plugin_registered{resource="aliyun.com/gpu-core"} 0.0' in metrics
            assert 'lj_device_plugin_registered{resource="aliyun.com/gpu"} 1.0' in metrics
        # no kubelet restart happens: the plugin itself must try again
        await _until(lambda: "aliyun.com/gpu-core" in reg.ok)
        assert reg.refused == ["aliyun.com/gpu-core"] * 2
        assert reg.ok.count("aliyun.com/gpu") == 1, "the registered one was left alone"
        status, text = await _get(url + "/healthz")
        assert status == 200, text
        assert text.startswith("ok"), text
        _, metrics = await _get(url + "/metrics")
        assert 'lj_device_plugin_registered{resource="aliyun.com/gpu-core"} 1.0' in metrics


# --- a forged assignment never reaches the Runtime when the device has no room ---------------


async def test_a_forged_assignment_beyond_the_device_is_refused_before_the_runtime(
    hostile: HostileRuntime,
) -> None:
    names = ResourceNames()
    # 90 of gpu-0's 100 cores are held by a running container
    hostile.answer(
        "ListAllocations",
        device_pb2.ListAllocationsResponse(
            allocations=[device_pb2.Allocation(id="a-1", device_ids=["gpu-0"], core_percent=90)]
        ),
    )
    forged = {
        "version": "v1",
        "node": "n1",
        "assumedAt": "t",
        "containers": [{"name": "c", "devices": [{"id": "gpu-0", "core": 20}]}],
    }
    pod = PodView(
        "tenant", "greedy", "u1", "1", {ASSIGNMENT: json.dumps(forged)}, {"c": {names.gpu_core: 20}}
    )
    client, shake, events = _refusing_handshake(hostile, names, pod)
    try:
        with pytest.raises(PermanentError, match="110 gpu-core units would exceed 100"):
            await shake.allocate(names.gpu_core, [f"gpu-0::core-{i}" for i in range(20)])
    finally:
        await client.close()
    assert hostile.calls("Allocate") == 0
    assert events == ["GpuAssignmentRefused"]


async def test_pod_resources_garbage_is_a_clear_temporary_error(tmp_path: Path) -> None:
    sock = str(tmp_path / "kubelet.sock")
    server = await serve_bytes(sock, "v1.PodResourcesLister", "List", NOT_PROTOBUF)
    client = PodResourcesClient(sock, 2.0)
    try:
        with pytest.raises(PodResourcesUnavailable, match="not a ListPodResourcesResponse"):
            await client.list()
    finally:
        await client.close()
        await server.stop(None)


async def test_a_forged_allocation_mark_cannot_borrow_another_pods_share(
    hostile: HostileRuntime,
) -> None:
    names = ResourceNames()
    # the victim's share of gpu-0, recorded by the Runtime for its own pod and container
    hostile.answer(
        "ListAllocations",
        device_pb2.ListAllocationsResponse(
            allocations=[
                device_pb2.Allocation(
                    id="victim-1",
                    device_ids=["gpu-0"],
                    core_percent=50,
                    memory_bytes=8 * GIB,
                    pod=device_pb2.PodRef(namespace="other", name="victim", uid="uv"),
                    container="main",
                )
            ]
        ),
    )
    assignment = {
        "version": "v1",
        "node": "n1",
        "assumedAt": "t",
        "containers": [{"name": "c", "devices": [{"id": "gpu-0", "core": 50, "memoryGiB": 8}]}],
    }
    # the pod's owner writes the plugin's own mark, naming the victim's allocation as if this
    # container were already answered for gpu-memory
    mark = {"containers": {"c": {names.gpu_memory: ["victim-1"]}}}
    pod = PodView(
        "tenant",
        "thief",
        "ut",
        "1",
        {ASSIGNMENT: json.dumps(assignment), ALLOCATION: json.dumps(mark)},
        {"c": {names.gpu_core: 50, names.gpu_memory: 8}},
    )
    client, shake, events = _refusing_handshake(hostile, names, pod)
    try:
        with pytest.raises(PermanentError, match="belong to another container"):
            await shake.allocate(names.gpu_core, [f"gpu-0::core-{i}" for i in range(50)])
    finally:
        await client.close()
    assert events == ["GpuAllocationMarkRefused"]


def _refusing_handshake(
    hostile: HostileRuntime, names: ResourceNames, pod: PodView
) -> tuple[RuntimeClient, SharedHandshake, list[str]]:
    """A handshake on node n1 (one 16 GiB gpu-0) whose only pod is ``pod``, which must be
    refused: marking it fails the test; the reasons of the Events it posts are collected."""
    events: list[str] = []

    async def pods() -> list[PodView]:
        return [pod]

    async def no_mark(p: PodView, update: Any) -> None:
        raise AssertionError("a refused pod is not marked")

    async def event(p: PodView, reason: str, message: str) -> None:
        events.append(reason)

    client = RuntimeClient(str(hostile.socket_dir), 2.0)
    shake = SharedHandshake(
        client,
        names,
        "n1",
        pods,
        no_mark,
        post_event=event,
        devices=lambda: [Device(id="gpu-0", memory_bytes=16 * GIB)],
    )
    return client, shake, events


HEALTHY = device_pb2.Health(state=device_pb2.HEALTH_STATE_HEALTHY)


def _lying_inventory() -> device_pb2.ListDevicesResponse:
    good = [
        device_pb2.Device(
            id=f"gpu-{i}",
            index=i,
            kind=device_pb2.DEVICE_KIND_GPU,
            memory_bytes=16 * GIB,
            numa_node=0,
            health=HEALTHY,
        )
        for i in range(2)
    ]
    far_numa = device_pb2.Device(
        id="gpu-2",
        index=2,
        kind=device_pb2.DEVICE_KIND_GPU,
        memory_bytes=16 * GIB,
        numa_node=5000,
        links=[
            device_pb2.Link(
                peer_id="gpu-0", type=device_pb2.LINK_TYPE_NVLINK, bandwidth_gbps=math.nan
            )
        ],
        health=HEALTHY,
    )
    overfull = device_pb2.Device(
        id="gpu-3",
        index=3,
        kind=device_pb2.DEVICE_KIND_GPU,
        memory_bytes=16 * GIB,
        partition_mode=device_pb2.PARTITION_MODE_MIG,
        partitions=[
            device_pb2.Partition(
                id="gpu-3-mig-0", profile="1g.10gb", memory_bytes=64 * GIB, health=HEALTHY
            )
        ],
        health=HEALTHY,
    )
    return device_pb2.ListDevicesResponse(devices=[*good, far_numa, overfull])


@pytest.fixture
async def lying_runtime() -> Any:
    with socket_dir() as d:
        h = HostileRuntime(d)
        await h.start()
        inventory = _lying_inventory()
        h.answer("GetVersion", version_reply())
        h.answer("ListDevices", inventory)
        h.answer(
            "WatchDevices",
            device_pb2.WatchDevicesResponse(
                type=device_pb2.DEVICE_EVENT_TYPE_SNAPSHOT, devices=inventory.devices
            ),
        )
        try:
            yield h
        finally:
            await h.stop()


async def test_the_kubelet_and_metrics_see_a_lying_runtime_screened(lying_runtime: Any) -> None:
    reg = Registrar()
    async with kubelet(reg) as plugin_dir, daemon(lying_runtime, plugin_dir) as (url, _, task):
        await _until(lambda: "aliyun.com/gpu" in reg.ok)
        sock = plugin_dir / "lj-aliyun.com-gpu.sock"
        async with grpc.aio.insecure_channel(sockets.unix_target(str(sock))) as ch:
            stream = api_pb2_grpc.DevicePluginStub(ch).ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            stream.cancel()
        _, metrics = await _get(url + "/metrics")
        assert not task.done()
    assert isinstance(first, api_pb2.ListAndWatchResponse)
    topology = {d.ID: [n.ID for n in d.topology.nodes] for d in first.devices}
    # gpu-3's MIG instance is larger than gpu-3: the device is withheld; gpu-2's NUMA node
    # cannot exist: it is advertised without one, not on node 5000 (nor clamped to 1023)
    assert topology == {"gpu-0": [0], "gpu-1": [0], "gpu-2": []}
    for field in ("partition.memory_bytes", "numa_node", "link.bandwidth_gbps"):
        assert f'lj_device_plugin_runtime_values_dropped_total{{field="{field}"}}' in metrics
