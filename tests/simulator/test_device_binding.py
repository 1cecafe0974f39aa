"""ConfigService.SetDeviceBinding and Device.binding of the simulator, through real sockets:
vfio-pci pass-through of whole, idle devices, seen on ListDevices/WatchDevices, kept across a
restart, refused by Allocate and SetPartitioning; and an older Runtime that knows none of it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator import Binding, Simulator, load_inventory, parse_inventory
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.fixtures import SimulatorFactory
from lj_runtimekit_testkit.simulator.inventory import InventoryError
from lj_runtimekit_testkit.simulator.services import ALL_METHODS, SET_DEVICE_BINDING

GIB = 1024**3
VFIO = pb.DEVICE_BINDING_VFIO
DRIVER = pb.DEVICE_BINDING_DRIVER


def _bind(device_id: str, binding: int) -> cpb.SetDeviceBindingRequest:
    return cpb.SetDeviceBindingRequest(device_id=device_id, binding=binding)  # type: ignore[arg-type]


def _req(ids: list[str], resource: str = "aliyun.com/gpu", core: int = 0) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        pod=pb.PodRef(namespace="ns", name="p", uid="u1"),
        container="c",
        resource_name=resource,
        device_ids=ids,
        core_percent=core,
        memory_bytes=GIB if core else 0,
    )


async def _event(stream: object) -> pb.WatchDevicesResponse:
    event = await asyncio.wait_for(stream.read(), 5.0)  # type: ignore[attr-defined]
    assert isinstance(event, pb.WatchDevicesResponse)
    return event


async def _devices(clients: RuntimeClients) -> dict[str, pb.Device]:
    return {d.id: d for d in (await clients.device.ListDevices(pb.ListDevicesRequest())).devices}


async def test_every_device_starts_on_the_driver_with_its_own_nodes(
    clients: RuntimeClients,
) -> None:
    devices = await _devices(clients)
    assert {d.binding for d in devices.values()} == {DRIVER}
    assert devices["gpu-3"].device_nodes == ["/dev/nvidia3"]
    version = await clients.device.GetVersion(pb.GetVersionRequest())
    assert SET_DEVICE_BINDING in version.capabilities


async def test_binding_to_vfio_shows_the_iommu_group_node_and_is_idempotent(
    clients: RuntimeClients,
) -> None:
    first = await clients.config.SetDeviceBinding(_bind("gpu-6", VFIO))
    assert first.changed
    assert first.device.binding == VFIO
    again = await clients.config.SetDeviceBinding(_bind("gpu-6", VFIO))
    assert not again.changed
    devices = await _devices(clients)
    # the default IOMMU group is a stable number from the index, not the index itself
    assert devices["gpu-6"].binding == VFIO
    assert devices["gpu-6"].device_nodes == ["/dev/vfio/22"]
    assert devices["gpu-5"].binding == DRIVER
    back = await clients.config.SetDeviceBinding(_bind("gpu-6", DRIVER))
    assert back.changed
    assert (await _devices(clients))["gpu-6"].device_nodes == ["/dev/nvidia6"]


@pytest.mark.parametrize(
    ("device", "binding", "code", "words"),
    [
        ("gpu-9", VFIO, grpc.StatusCode.NOT_FOUND, "unknown device 'gpu-9'"),
        ("gpu-1", pb.DEVICE_BINDING_UNSPECIFIED, grpc.StatusCode.INVALID_ARGUMENT, "not one of"),
        ("gpu-1", 7, grpc.StatusCode.INVALID_ARGUMENT, "not one of"),
    ],
    ids=["unknown-device", "unspecified", "unknown-enum-number"],
)
async def test_bad_binding_requests_are_refused(
    clients: RuntimeClients, device: str, binding: int, code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.config.SetDeviceBinding(_bind(device, binding))
    assert err.value.code() == code
    assert words in str(err.value.details())


async def test_a_partitioned_or_allocated_device_is_not_bound_to_vfio(
    clients: RuntimeClients,
) -> None:
    await clients.config.SetPartitioning(
        cpb.SetPartitioningRequest(device_id="gpu-2", tdm=cpb.TdmSpec(slice_percents=[50, 50]))
    )
    await clients.device.Allocate(_req(["gpu-3"]))
    await clients.device.Allocate(_req(["gpu-4"], "aliyun.com/gpu-core", core=20))
    for device, words in (
        ("gpu-2", "is in tdm mode"),
        ("gpu-3", "live allocations"),
        ("gpu-4", "live allocations"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await clients.config.SetDeviceBinding(_bind(device, VFIO))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, device
        assert words in str(err.value.details()), device
    assert {d.binding for d in (await _devices(clients)).values()} == {DRIVER}


async def test_a_vfio_device_takes_no_allocation_and_no_partitioning(
    clients: RuntimeClients,
) -> None:
    await clients.config.SetDeviceBinding(_bind("gpu-7", VFIO))
    for request in (_req(["gpu-7"]), _req(["gpu-7"], "aliyun.com/gpu-core", core=10)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await clients.device.Allocate(request)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "bound to vfio-pci" in str(err.value.details())
    for partitioning in (
        cpb.SetPartitioningRequest(device_id="gpu-7", mig=cpb.MigSpec(profiles=["1g.10gb"])),
        cpb.SetPartitioningRequest(device_id="gpu-7"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await clients.config.SetPartitioning(partitioning)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "bound to vfio-pci" in str(err.value.details())
    assert not (await clients.device.ListAllocations(pb.ListAllocationsRequest())).allocations


async def test_a_binding_change_is_published_on_watch_devices(clients: RuntimeClients) -> None:
    stream = clients.device.WatchDevices(pb.WatchDevicesRequest())
    snapshot = await _event(stream)
    assert snapshot.type == pb.DEVICE_EVENT_TYPE_SNAPSHOT
    await clients.config.SetDeviceBinding(_bind("gpu-1", VFIO))
    await clients.config.SetDeviceBinding(_bind("gpu-1", VFIO))  # no change, no event
    await clients.config.SetDeviceBinding(_bind("gpu-1", DRIVER))
    events = [await _event(stream) for _ in range(2)]
    stream.cancel()
    got = [(e.type, [(d.id, d.binding, list(d.device_nodes)) for d in e.devices]) for e in events]
    assert got == [
        (pb.DEVICE_EVENT_TYPE_PARTITIONS_CHANGED, [("gpu-1", VFIO, ["/dev/vfio/17"])]),
        (pb.DEVICE_EVENT_TYPE_PARTITIONS_CHANGED, [("gpu-1", DRIVER, ["/dev/nvidia1"])]),
    ]


async def test_bindings_survive_a_restart_of_the_simulator(
    runtime_sim_factory: SimulatorFactory, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    sim = await runtime_sim_factory(state_file=state)
    async with runtime_clients(sim) as c:
        await c.config.SetDeviceBinding(_bind("gpu-0", VFIO))
    await sim.stop()
    again = await runtime_sim_factory(state_file=state)  # a new process reading the state file
    async with runtime_clients(again) as c:
        devices = await _devices(c)
    assert devices["gpu-0"].binding == VFIO
    assert devices["gpu-0"].device_nodes == ["/dev/vfio/16"]
    assert devices["gpu-1"].binding == DRIVER


async def test_an_older_runtime_answers_unimplemented_and_leaves_binding_unset(
    runtime_sim_factory: SimulatorFactory,
) -> None:
    old = [m for m in ALL_METHODS if m != SET_DEVICE_BINDING]
    sim = await runtime_sim_factory(capabilities=old)
    async with runtime_clients(sim) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.config.SetDeviceBinding(_bind("gpu-0", VFIO))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        devices = await _devices(c)
        stream = c.device.WatchDevices(pb.WatchDevicesRequest())
        snapshot = await _event(stream)
        stream.cancel()
    assert {d.binding for d in devices.values()} == {pb.DEVICE_BINDING_UNSPECIFIED}
    assert {d.binding for d in snapshot.devices} == {pb.DEVICE_BINDING_UNSPECIFIED}
    assert devices["gpu-0"].device_nodes == ["/dev/nvidia0"]


def test_inventory_keys_bind_a_device_and_name_its_iommu_group() -> None:
    text = """
version: v1
defaults: {model: NVIDIA H800, memory_gib: 80, compute_units: 132, supports: [mig]}
devices:
  - {id: gpu-0, pci_bus_id: "0000:18:00.0"}
  - {id: gpu-1, pci_bus_id: "0000:2a:00.0", binding: vfio, iommu_group: 41}
  - {id: gpu-2, pci_bus_id: "0000:3a:00.0", binding: vfio}
"""
    devs = {d.id: d for d in parse_inventory(text).devices}
    assert devs["gpu-0"].nodes == ("/dev/nvidia0",)
    assert devs["gpu-1"].nodes == ("/dev/vfio/41",)
    assert devs["gpu-2"].nodes == ("/dev/vfio/18",)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("binding: pci-stub", "binding: expected one of ['driver', 'vfio']"),
        ("iommu_group: -1", "iommu_group: expected an integer >= 0"),
        ("iommu_group: 17", "iommu_group 17 is used twice"),  # gpu-1's default group
        (
            "binding: vfio, partitioning: {mode: mig, profiles: [1g.10gb]}",
            "cannot be in mig mode",
        ),
    ],
    ids=["unknown-binding", "negative-group", "shared-group", "vfio-and-mig"],
)
def test_bad_binding_keys_are_refused_by_name(extra: str, words: str) -> None:
    text = f"""
version: v1
defaults: {{model: NVIDIA H800, memory_gib: 80, compute_units: 132, supports: [mig]}}
devices:
  - {{id: gpu-0, pci_bus_id: "0000:18:00.0", {extra}}}
  - {{id: gpu-1, pci_bus_id: "0000:2a:00.0"}}
"""
    with pytest.raises(InventoryError) as err:
        parse_inventory(text, source="inv.yaml")
    assert words in str(err.value)
    assert "inv.yaml" in str(err.value)


async def test_an_inventory_bound_device_is_vfio_from_the_start(
    runtime_sim_factory: SimulatorFactory,
) -> None:
    inv = load_inventory("gpu-8x-nvlink")
    bound = dataclasses.replace(
        inv,
        devices=tuple(
            dataclasses.replace(d, binding=Binding.VFIO) if d.id == "gpu-5" else d
            for d in inv.devices
        ),
    )
    sim: Simulator = await runtime_sim_factory(inventory=bound)
    async with runtime_clients(sim) as c:
        assert (await _devices(c))["gpu-5"].binding == VFIO
        back = await c.config.SetDeviceBinding(_bind("gpu-5", DRIVER))
    assert back.changed
    assert back.device.device_nodes == ["/dev/nvidia5"]
