"""SetPartitioning after allocations: refused only while something is allocated on the GPU
(whole, a share, or one of its partitions); once released, MIG/TDM may change, never both."""

from __future__ import annotations

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator.clients import RuntimeClients

GIB = 1 << 30


def _req(devices: list[str], *, core: int = 0, name: str = "p") -> pb.AllocateRequest:
    resource = "aliyun.com/gpu-core" if core else "aliyun.com/gpu"
    return pb.AllocateRequest(
        pod=pb.PodRef(namespace="ns", name=name, uid=f"uid-{name}"),
        container="main",
        resource_name=resource,
        device_ids=devices,
        core_percent=core,
        memory_bytes=GIB if core else 0,
    )


async def _set(c: RuntimeClients, request: cpb.SetPartitioningRequest) -> grpc.StatusCode:
    try:
        await c.config.SetPartitioning(request)
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


MIG = cpb.SetPartitioningRequest(device_id="gpu-3", mig=cpb.MigSpec(profiles=["3g.40gb"]))
TDM = cpb.SetPartitioningRequest(device_id="gpu-3", tdm=cpb.TdmSpec(slice_percents=[50, 50]))
NONE = cpb.SetPartitioningRequest(device_id="gpu-3")


@pytest.mark.parametrize("core", [0, 30], ids=["whole", "share"])
async def test_a_gpu_is_repartitioned_once_its_allocations_are_released(
    clients: RuntimeClients, core: int
) -> None:
    alloc = (await clients.device.Allocate(_req(["gpu-3"], core=core))).allocation
    assert await _set(clients, MIG) == grpc.StatusCode.FAILED_PRECONDITION
    await clients.device.Release(pb.ReleaseRequest(allocation_id=alloc.id))
    assert await _set(clients, MIG) == grpc.StatusCode.OK
    part = (await clients.device.Allocate(_req(["gpu-3-mig-3g.40gb-0"]))).allocation
    # a MIG partition in use: neither TDM nor unpartitioned
    assert await _set(clients, TDM) == grpc.StatusCode.FAILED_PRECONDITION
    assert await _set(clients, NONE) == grpc.StatusCode.FAILED_PRECONDITION
    await clients.device.Release(pb.ReleaseRequest(allocation_id=part.id))
    # released: MIG → TDM in one step, the GPU is never both
    assert await _set(clients, TDM) == grpc.StatusCode.OK
    devices = (await clients.device.ListDevices(pb.ListDevicesRequest())).devices
    gpu3 = next(d for d in devices if d.id == "gpu-3")
    assert gpu3.partition_mode == pb.PARTITION_MODE_TDM
    assert all("-tdm-" in p.id for p in gpu3.partitions)
    assert await _set(clients, NONE) == grpc.StatusCode.OK


async def test_another_gpus_allocation_does_not_block_repartitioning(
    clients: RuntimeClients,
) -> None:
    await clients.device.Allocate(_req(["gpu-2"]))
    await clients.device.Allocate(_req(["gpu-1"], name="q"))
    assert await _set(clients, MIG) == grpc.StatusCode.OK


async def test_update_allocation_owner_keeps_devices_and_refuses_unknown_ids(
    clients: RuntimeClients,
) -> None:
    alloc = (await clients.device.Allocate(_req(["gpu-4"], name="provisional"))).allocation
    got = await clients.device.UpdateAllocationOwner(
        pb.UpdateAllocationOwnerRequest(
            allocation_id=alloc.id,
            pod=pb.PodRef(namespace="ns", name="real", uid="uid-real"),
            container="train",
        )
    )
    assert (got.allocation.pod.name, got.allocation.container) == ("real", "train")
    assert list(got.allocation.device_ids) == ["gpu-4"]
    assert got.allocation.injection == alloc.injection
    listed = (await clients.device.ListAllocations(pb.ListAllocationsRequest())).allocations
    assert [(a.pod.uid, a.container) for a in listed] == [("uid-real", "train")]
    for request, code in [
        (
            pb.UpdateAllocationOwnerRequest(
                allocation_id="alloc-999999",
                pod=pb.PodRef(namespace="ns", name="x", uid="u"),
                container="c",
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            pb.UpdateAllocationOwnerRequest(allocation_id=alloc.id, container="c"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await clients.device.UpdateAllocationOwner(request)
        assert e.value.code() == code
    version = await clients.device.GetVersion(pb.GetVersionRequest())
    assert "DeviceService.UpdateAllocationOwner" in version.capabilities
