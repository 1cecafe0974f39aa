"""ConfigService.CreatePartition and DeletePartition of the simulator, through real sockets: one
partition at a time beside the ones a device has, which keep their ids and allocations; refusals
that change nothing; ids kept across a restart; an older Runtime answers UNIMPLEMENTED."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.fixtures import SimulatorFactory
from lj_runtimekit_testkit.simulator.services import ALL_METHODS

GIB = 1024**3


def _mig(device: str, profile: str) -> cpb.CreatePartitionRequest:
    return cpb.CreatePartitionRequest(device_id=device, mig_profile=profile)


def _tdm(device: str, percent: int) -> cpb.CreatePartitionRequest:
    return cpb.CreatePartitionRequest(device_id=device, tdm_percent=percent)


def _alloc(ids: list[str], uid: str = "u1", core: int = 0) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        pod=pb.PodRef(namespace="ns", name=f"p-{uid}", uid=uid),
        container="c",
        resource_name="aliyun.com/gpu-core" if core else "aliyun.com/gpu",
        device_ids=ids,
        core_percent=core,
        memory_bytes=GIB if core else 0,
    )


async def _device(c: RuntimeClients, device_id: str) -> pb.Device:
    devices = (await c.device.ListDevices(pb.ListDevicesRequest())).devices
    return next(d for d in devices if d.id == device_id)


async def _refused(call: object, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    return str(err.value.details())


async def test_partitions_come_one_at_a_time_beside_held_ones_and_go_back_to_whole(
    clients: RuntimeClients,
) -> None:
    c = clients
    first = await c.config.CreatePartition(_mig("gpu-0", "3g.40gb"))
    assert first.partition_id == "gpu-0-mig-3g.40gb-0"
    assert first.device.partition_mode == pb.PARTITION_MODE_MIG
    held = await c.device.Allocate(_alloc([first.partition_id]))
    second = await c.config.CreatePartition(_mig("gpu-0", "2g.20gb"))
    assert second.partition_id == "gpu-0-mig-2g.20gb-0"
    third = await c.config.CreatePartition(_mig("gpu-0", "1g.10gb"))
    fourth = await c.config.CreatePartition(_mig("gpu-0", "1g.10gb"))
    gpu = await _device(c, "gpu-0")
    assert [p.id for p in gpu.partitions] == [
        "gpu-0-mig-3g.40gb-0",
        "gpu-0-mig-2g.20gb-0",
        "gpu-0-mig-1g.10gb-0",
        "gpu-0-mig-1g.10gb-1",
    ]
    # 7 of 7 compute slices and 80 of 80 GiB used: nothing more fits, and nothing changed
    details = await _refused(
        c.config.CreatePartition(_mig("gpu-0", "1g.10gb")), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert "7" in details
    assert len((await _device(c, "gpu-0")).partitions) == 4
    # the held one cannot go; the idle ones can, and the held one keeps its id and allocation
    details = await _refused(
        c.config.DeletePartition(cpb.DeletePartitionRequest(partition_id=first.partition_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert held.allocation.id in details
    for idle in (second, third, fourth):
        await c.config.DeletePartition(cpb.DeletePartitionRequest(partition_id=idle.partition_id))
    again = await c.config.CreatePartition(_mig("gpu-0", "4g.40gb"))
    assert again.partition_id == "gpu-0-mig-4g.40gb-0"
    allocs = (await c.device.ListAllocations(pb.ListAllocationsRequest())).allocations
    assert [list(a.device_ids) for a in allocs] == [[first.partition_id]]
    await c.device.Release(pb.ReleaseRequest(allocation_id=held.allocation.id))
    for pid in (first.partition_id, again.partition_id):
        await c.config.DeletePartition(cpb.DeletePartitionRequest(partition_id=pid))
    gpu = await _device(c, "gpu-0")
    assert gpu.partition_mode == pb.PARTITION_MODE_NONE
    assert not gpu.partitions
    await c.device.Allocate(_alloc(["gpu-0"], uid="u2"))  # whole again


async def test_tdm_slices_one_at_a_time_up_to_one_hundred_percent(clients: RuntimeClients) -> None:
    c = clients
    ids = [(await c.config.CreatePartition(_tdm("gpu-1", pct))).partition_id for pct in (50, 25)]
    assert ids == ["gpu-1-tdm-0", "gpu-1-tdm-1"]
    await _refused(c.config.CreatePartition(_tdm("gpu-1", 50)), grpc.StatusCode.FAILED_PRECONDITION)
    # the other mode cannot join
    details = await _refused(
        c.config.CreatePartition(_mig("gpu-1", "1g.10gb")), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert "tdm" in details
    await c.config.DeletePartition(cpb.DeletePartitionRequest(partition_id="gpu-1-tdm-0"))
    assert (await c.config.CreatePartition(_tdm("gpu-1", 75))).partition_id == "gpu-1-tdm-0"


async def test_a_device_held_whole_or_shared_gets_no_partition(clients: RuntimeClients) -> None:
    c = clients
    await c.device.Allocate(_alloc(["gpu-2"]))
    await c.device.Allocate(_alloc(["gpu-3"], uid="u2", core=30))
    for device in ("gpu-2", "gpu-3"):
        await _refused(
            c.config.CreatePartition(_mig(device, "1g.10gb")), grpc.StatusCode.FAILED_PRECONDITION
        )
        assert not (await _device(c, device)).partitions
    await _refused(
        c.config.CreatePartition(cpb.CreatePartitionRequest(device_id="gpu-4")),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await _refused(c.config.CreatePartition(_mig("gpu-9", "1g.10gb")), grpc.StatusCode.NOT_FOUND)
    await _refused(
        c.config.CreatePartition(_mig("gpu-4", "9g.90gb")), grpc.StatusCode.FAILED_PRECONDITION
    )
    await _refused(
        c.config.DeletePartition(cpb.DeletePartitionRequest(partition_id="gpu-4-mig-1g.10gb-0")),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_partition_ids_survive_a_restart(
    runtime_sim_factory: SimulatorFactory, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    sim = await runtime_sim_factory(state_file=state)
    async with runtime_clients(sim) as c:
        for _ in range(2):
            await c.config.CreatePartition(_mig("gpu-0", "1g.10gb"))
        await c.config.DeletePartition(
            cpb.DeletePartitionRequest(partition_id="gpu-0-mig-1g.10gb-0")
        )
        held = await c.device.Allocate(_alloc(["gpu-0-mig-1g.10gb-1"]))
    await sim.stop()
    again = await runtime_sim_factory(state_file=state)
    async with runtime_clients(again) as c:
        gpu = await _device(c, "gpu-0")
        assert [p.id for p in gpu.partitions] == ["gpu-0-mig-1g.10gb-1"]
        allocs = (await c.device.ListAllocations(pb.ListAllocationsRequest())).allocations
        assert [(a.id, list(a.device_ids)) for a in allocs] == [
            (held.allocation.id, ["gpu-0-mig-1g.10gb-1"])
        ]


async def test_an_older_runtime_answers_unimplemented(
    runtime_sim_factory: SimulatorFactory,
) -> None:
    old = [m for m in ALL_METHODS if not m.endswith(("CreatePartition", "DeletePartition"))]
    sim = await runtime_sim_factory(capabilities=old)
    async with runtime_clients(sim) as c:
        await _refused(
            c.config.CreatePartition(_mig("gpu-0", "1g.10gb")), grpc.StatusCode.UNIMPLEMENTED
        )
        assert not (await _device(c, "gpu-0")).partitions
