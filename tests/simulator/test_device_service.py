"""DeviceService of the simulator through its real unix socket and a real grpc.aio channel."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator import Simulator
from lj_runtimekit_testkit.simulator.clients import RuntimeClients

GIB = 1024**3
POD = pb.PodRef(namespace="ns", name="train-0", uid="uid-1")


def _req(
    resource: str, ids: list[str], core: int = 0, mem: int = 0, uid: str = "uid-1"
) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        pod=pb.PodRef(namespace="ns", name="p", uid=uid),
        container="main",
        resource_name=resource,
        device_ids=ids,
        core_percent=core,
        memory_bytes=mem,
    )


async def test_version_names_every_method_as_a_capability(clients: RuntimeClients) -> None:
    v = await clients.device.GetVersion(pb.GetVersionRequest())
    assert (v.version, v.api_version) == ("v1.13.0", "v1")
    assert "DeviceService.WatchDevices" in v.capabilities
    assert "ConfigService.SetPartitioning" in v.capabilities


async def test_list_devices_gives_topology_numa_and_health(clients: RuntimeClients) -> None:
    devices = (await clients.device.ListDevices(pb.ListDevicesRequest())).devices
    assert [d.id for d in devices] == [f"gpu-{i}" for i in range(8)]
    gpu0 = devices[0]
    assert gpu0.kind == pb.DEVICE_KIND_GPU
    assert gpu0.memory_bytes == 80 * GIB
    assert gpu0.numa_node == 0
    assert devices[7].numa_node == 1
    links = {link.peer_id: link.type for link in gpu0.links}
    assert links["gpu-3"] == pb.LINK_TYPE_NVLINK
    assert links["gpu-4"] == pb.LINK_TYPE_SYSTEM
    assert gpu0.health.state == pb.HEALTH_STATE_HEALTHY
    assert gpu0.device_nodes == ["/dev/nvidia0"]


async def test_whole_allocation_injects_devices_and_is_listed_then_released(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    alloc = (await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-0", "gpu-1"]))).allocation
    inj = alloc.injection
    assert inj.envs["NVIDIA_VISIBLE_DEVICES"].count("GPU-") == 2
    assert inj.annotations["xdm.amp.com.devices"] == "gpu-0,gpu-1"
    # Only keys that containerd's path.Match("xdm.amp.com*", key) passes: no "/" (contracts.md).
    assert set(inj.annotations) <= set(sockets.INJECTION_ANNOTATION_KEYS)
    assert not [k for k in inj.annotations if "/" in k]
    assert {n.host_path for n in inj.device_nodes} >= {
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
    }
    assert inj.mounts
    assert inj.mounts[0].read_only
    listed = (await clients.device.ListAllocations(pb.ListAllocationsRequest())).allocations
    assert [a.id for a in listed] == [alloc.id] == [a.id for a in runtime_sim.allocations()]
    released = await clients.device.Release(pb.ReleaseRequest(allocation_id=alloc.id))
    assert released.released == 1
    again = await clients.device.Release(pb.ReleaseRequest(allocation_id=alloc.id))
    assert again.released == 0  # releasing an unknown allocation is not an error
    assert not runtime_sim.allocations()


async def test_release_by_pod_frees_all_of_its_allocations(clients: RuntimeClients) -> None:
    for dev in ("gpu-2", "gpu-3"):
        await clients.device.Allocate(_req("aliyun.com/gpu-core", [dev], core=30, uid="u9"))
    out = await clients.device.Release(pb.ReleaseRequest(pod=pb.PodRef(uid="u9")))
    assert out.released == 2


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (_req("aliyun.com/gpu", ["gpu-99"]), grpc.StatusCode.INVALID_ARGUMENT, "unknown device"),
        (_req("example.com/tpu", ["gpu-0"]), grpc.StatusCode.INVALID_ARGUMENT, "unknown resource"),
        (_req("alibabacloud.com/ppu", ["gpu-0"]), grpc.StatusCode.INVALID_ARGUMENT, "is a gpu"),
        (_req("aliyun.com/gpu", []), grpc.StatusCode.INVALID_ARGUMENT, "no device ids"),
        (
            _req("aliyun.com/gpu-core", ["gpu-0"], core=101),
            grpc.StatusCode.INVALID_ARGUMENT,
            "over 100",
        ),
        (
            _req("aliyun.com/gpu-memory", ["gpu-0"], mem=81 * GIB),
            grpc.StatusCode.INVALID_ARGUMENT,
            "the device has",
        ),
        (
            _req("aliyun.com/gpu-core", ["gpu-0"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "shared resource",
        ),
        (
            pb.AllocateRequest(resource_name="aliyun.com/gpu", device_ids=["gpu-0"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "missing pod.namespace",
        ),
    ],
    ids=[
        "unknown-id",
        "unknown-resource",
        "wrong-kind",
        "no-ids",
        "core-over-100",
        "memory-over-device",
        "shared-without-share",
        "no-pod",
    ],
)
async def test_bad_allocate_is_refused_with_a_clear_error(
    clients: RuntimeClients, request_: pb.AllocateRequest, code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.device.Allocate(request_)
    assert err.value.code() == code
    assert words in (err.value.details() or "")


async def test_over_allocation_of_core_and_memory_is_exhausted(clients: RuntimeClients) -> None:
    await clients.device.Allocate(_req("aliyun.com/gpu-core", ["gpu-0"], core=60, mem=40 * GIB))
    for core, mem, words in ((50, GIB, "40% of 100% free"), (10, 41 * GIB, "free")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await clients.device.Allocate(_req("aliyun.com/gpu-core", ["gpu-0"], core, mem))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert words in (err.value.details() or "")
    await clients.device.Allocate(_req("aliyun.com/gpu-core", ["gpu-0"], core=40, mem=40 * GIB))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-0"]))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_unhealthy_device_takes_no_allocation(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    runtime_sim.set_health("gpu-5", False, "XID 79: GPU has fallen off the bus")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-5"]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "XID 79" in (err.value.details() or "")


async def test_health_flip_is_seen_on_the_watch_stream_within_a_second(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    stream = clients.device.WatchDevices(pb.WatchDevicesRequest())
    first = await asyncio.wait_for(stream.read(), 1.0)
    assert isinstance(first, pb.WatchDevicesResponse)
    assert first.type == pb.DEVICE_EVENT_TYPE_SNAPSHOT
    assert len(first.devices) == 8
    runtime_sim.set_health("gpu-3", False, "XID 48: double bit ECC error")
    event = await asyncio.wait_for(stream.read(), 1.0)
    assert isinstance(event, pb.WatchDevicesResponse)
    assert event.type == pb.DEVICE_EVENT_TYPE_HEALTH_CHANGED
    assert [(d.id, d.health.state) for d in event.devices] == [("gpu-3", pb.HEALTH_STATE_UNHEALTHY)]
    assert "XID 48" in event.devices[0].health.reason
    runtime_sim.set_health("gpu-3", True)
    back = await asyncio.wait_for(stream.read(), 1.0)
    assert isinstance(back, pb.WatchDevicesResponse)
    assert back.devices[0].health.state == pb.HEALTH_STATE_HEALTHY
    stream.cancel()


async def test_restart_ends_the_stream_with_unavailable_and_clients_reconnect(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    alloc = (await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-6"]))).allocation
    stream = clients.device.WatchDevices(pb.WatchDevicesRequest())
    await asyncio.wait_for(stream.read(), 1.0)
    await runtime_sim.stop()
    assert not runtime_sim.socket_path("DeviceService").exists()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(stream.read(), 2.0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # not a clean end (EOF)
    await runtime_sim.start()
    assert runtime_sim.socket_path("DeviceService").exists()
    listed = await clients.device.ListAllocations(
        pb.ListAllocationsRequest(), wait_for_ready=True, timeout=5
    )
    assert [a.id for a in listed.allocations] == [alloc.id]  # the Runtime keeps its state


async def test_added_and_removed_devices_are_streamed(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    stream = clients.device.WatchDevices(pb.WatchDevicesRequest())
    await asyncio.wait_for(stream.read(), 1.0)
    gpu7 = next(d for d in runtime_sim.devices() if d.id == "gpu-7")
    runtime_sim.remove_device("gpu-7")
    runtime_sim.add_device(gpu7)
    kinds = []
    for _ in range(2):
        msg = await asyncio.wait_for(stream.read(), 1.0)
        assert isinstance(msg, pb.WatchDevicesResponse)
        kinds.append((msg.type, msg.devices[0].id))
    assert kinds == [(pb.DEVICE_EVENT_TYPE_REMOVED, "gpu-7"), (pb.DEVICE_EVENT_TYPE_ADDED, "gpu-7")]
    stream.cancel()
