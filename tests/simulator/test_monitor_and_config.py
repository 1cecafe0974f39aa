"""MonitorService and ConfigService of the simulator through real sockets and channels."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_interface.runtime.v1 import monitor_pb2 as mpb
from lj_runtimekit_testkit.simulator import Simulator
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.fixtures import SimulatorFactory

GIB = 1024**3


def _req(resource: str, ids: list[str], core: int = 0, mem: int = 0) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        pod=pb.PodRef(namespace="ns", name="p", uid="u1"),
        container="c",
        resource_name=resource,
        device_ids=ids,
        core_percent=core,
        memory_bytes=mem,
    )


async def test_device_metrics_follow_what_is_allocated(clients: RuntimeClients) -> None:
    idle = await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest())
    assert len(idle.devices) == 8
    assert idle.sampled_at.seconds > 0
    gpu0 = idle.devices[0]
    assert gpu0.utilization_ratio == 0
    assert gpu0.memory_total_bytes == 80 * GIB
    assert 0 < gpu0.power_watts <= gpu0.power_limit_watts
    assert len(gpu0.links) == 7
    await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-0"]))
    busy = await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest(device_ids=["gpu-0"]))
    (m,) = busy.devices
    assert 0.5 < m.utilization_ratio <= 1
    assert 0 < m.memory_used_bytes <= m.memory_total_bytes
    assert m.temperature_celsius > gpu0.temperature_celsius
    assert m.energy_joules_total >= gpu0.energy_joules_total


async def test_unhealthy_device_reports_its_xid(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    runtime_sim.set_health("gpu-2", False, "XID 79: GPU has fallen off the bus")
    out = await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest(device_ids=["gpu-2"]))
    assert out.devices[0].errors.last_xid == 79
    assert out.devices[0].errors.xid_total >= 1


async def test_unknown_device_metrics_are_not_found(clients: RuntimeClients) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest(device_ids=["gpu-x"]))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_allocation_usage_stays_within_each_share(clients: RuntimeClients) -> None:
    a = await clients.device.Allocate(_req("aliyun.com/gpu-core", ["gpu-1"], 30, 8 * GIB))
    b = await clients.device.Allocate(_req("aliyun.com/gpu-core", ["gpu-1"], 50, 16 * GIB))
    usage = (await clients.monitor.GetAllocationUsage(mpb.GetAllocationUsageRequest())).usage
    by_id = {u.allocation_id: u for u in usage}
    for alloc in (a.allocation, b.allocation):
        u = by_id[alloc.id]
        assert u.device_id == "gpu-1"
        assert 0 < u.utilization_ratio <= alloc.core_percent / 100
        assert 0 < u.memory_used_bytes <= alloc.memory_bytes
    only = mpb.GetDeviceMetricsRequest(device_ids=["gpu-1"])
    dev = await clients.monitor.GetDeviceMetrics(only)
    total = sum(u.utilization_ratio for u in usage)
    assert dev.devices[0].utilization_ratio == pytest.approx(total, rel=0.01)  # sampled later


async def test_features_switch_idempotently(clients: RuntimeClients) -> None:
    state = await clients.config.GetFeatureState(cpb.GetFeatureStateRequest())
    assert not state.enabled
    assert state.runtime_version == "v1.13.0"
    assert {f.name for f in state.features} == {"device-injection", "sharing", "monitoring"}
    first = await clients.config.SetFeatures(cpb.SetFeaturesRequest(enabled=True))
    assert first.changed
    assert first.state.enabled
    again = await clients.config.SetFeatures(cpb.SetFeaturesRequest(enabled=True))
    assert not again.changed
    one = await clients.config.SetFeatures(
        cpb.SetFeaturesRequest(enabled=False, features=["sharing"])
    )
    assert {f.name: f.enabled for f in one.state.features}["sharing"] is False
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.config.SetFeatures(cpb.SetFeaturesRequest(enabled=True, features=["warp"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_partitioning_round_trip_and_mig_tdm_exclusive(clients: RuntimeClients) -> None:
    mig = await clients.config.SetPartitioning(
        cpb.SetPartitioningRequest(
            device_id="gpu-4", mig=cpb.MigSpec(profiles=["3g.40gb", "2g.20gb"])
        )
    )
    assert mig.partition_ids == ["gpu-4-mig-3g.40gb-0", "gpu-4-mig-2g.20gb-0"]
    devices = (await clients.device.ListDevices(pb.ListDevicesRequest())).devices
    gpu4 = next(d for d in devices if d.id == "gpu-4")
    assert gpu4.partition_mode == pb.PARTITION_MODE_MIG
    assert [p.memory_bytes for p in gpu4.partitions] == [40 * GIB, 20 * GIB]
    part = await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-4-mig-2g.20gb-0"]))
    assert "MIG-" in part.allocation.injection.envs["NVIDIA_VISIBLE_DEVICES"]
    cases = [
        (
            cpb.SetPartitioningRequest(
                device_id="gpu-5",
                mig=cpb.MigSpec(profiles=["1g.10gb"]),
                tdm=cpb.TdmSpec(slice_percents=[50]),
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "exclusive",
        ),
        (
            cpb.SetPartitioningRequest(device_id="gpu-4"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "live allocations",
        ),
        (
            cpb.SetPartitioningRequest(device_id="gpu-5", tdm=cpb.TdmSpec(slice_percents=[60, 50])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "110%",
        ),
        (
            cpb.SetPartitioningRequest(
                device_id="gpu-5", mig=cpb.MigSpec(profiles=["4g.40gb"] * 2)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "compute slices",
        ),
        (cpb.SetPartitioningRequest(device_id="gpu-9"), grpc.StatusCode.NOT_FOUND, "unknown"),
    ]
    for request, code, words in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await clients.config.SetPartitioning(request)
        assert err.value.code() == code, request
        assert words in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as whole:
        await clients.device.Allocate(_req("aliyun.com/gpu", ["gpu-4"]))
    assert whole.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_state_file_keeps_features_and_partitioning_across_a_new_process(
    runtime_sim_factory: SimulatorFactory, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    sim = await runtime_sim_factory(inventory="gpu-1x", state_file=state)
    async with runtime_clients(sim) as c:
        await c.config.SetFeatures(cpb.SetFeaturesRequest(enabled=True))
        await c.config.SetPartitioning(
            cpb.SetPartitioningRequest(device_id="gpu-0", tdm=cpb.TdmSpec(slice_percents=[50, 50]))
        )
    await sim.stop()
    assert json.loads(state.read_text())["version"] == "v1"
    fresh = await runtime_sim_factory(inventory="gpu-1x", state_file=state)
    async with runtime_clients(fresh) as c:
        assert (await c.config.GetFeatureState(cpb.GetFeatureStateRequest())).enabled
        (dev,) = (await c.device.ListDevices(pb.ListDevicesRequest())).devices
        assert dev.partition_mode == pb.PARTITION_MODE_TDM
        assert [p.time_percent for p in dev.partitions] == [50, 50]
