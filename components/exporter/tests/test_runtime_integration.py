"""The exporter against the runtime simulator, through its real sockets and a real HTTP port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc
from lj_runtimekit_testkit.kubelet.emulator import KubeletEmulator
from lj_runtimekit_testkit.simulator.simulator import Simulator

GiB = 2**30
SHARED = "aliyun.com/gpu-core"
UTIL = "lj_runtimekit_device_utilization_ratio"
CONTAINER_UTIL = "lj_runtimekit_container_utilization_ratio"
CORE = "lj_runtimekit_container_allocated_core_ratio"
UP = "lj_runtimekit_runtime_up"
Factory = Callable[..., Awaitable[Any]]
if TYPE_CHECKING:
    Stub = device_pb2_grpc.DeviceServiceAsyncStub
else:  # the async stub type exists only in the generated .pyi
    Stub = device_pb2_grpc.DeviceServiceStub


def values(series: dict[str, Any], name: str, **match: str) -> list[float]:
    return [
        float(v)
        for labels, v in series.get(name, [])
        if all(labels.get(k) == x for k, x in match.items())
    ]


def one(series: dict[str, Any], name: str, **match: str) -> float:
    hits = values(series, name, **match)
    assert len(hits) == 1, f"{name}{match}: {hits}"
    return hits[0]


def up_is(value: float) -> Callable[[dict[str, Any]], bool]:
    return lambda s: values(s, UP) == [value]


def has(name: str, **match: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: any(
        all(labels.get(k) == x for k, x in match.items()) for labels, _ in s.get(name, [])
    )


@pytest.fixture
async def device_stub(runtime_sim: Simulator) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(runtime_sim.target("DeviceService")) as ch:
        yield device_pb2_grpc.DeviceServiceStub(ch)


async def allocate(
    stub: Stub,
    pod: str,
    device_ids: list[str],
    *,
    core: int = 0,
    memory: int = 0,
    resource: str = "aliyun.com/gpu",
) -> str:
    r = await stub.Allocate(
        device_pb2.AllocateRequest(
            pod=device_pb2.PodRef(namespace="team", name=pod, uid=f"uid-{pod}"),
            container="main",
            resource_name=resource,
            device_ids=device_ids,
            core_percent=core,
            memory_bytes=memory,
        )
    )
    return r.allocation.id


async def test_shared_gpu_gives_each_pod_its_own_usage_not_the_device_value(
    runtime_sim: Simulator, device_stub: Stub, exporter_factory: Factory
) -> None:
    for pod, core in (("small", 30), ("large", 70)):
        await allocate(device_stub, pod, ["gpu-0"], core=core, memory=8 * GiB, resource=SHARED)
    await allocate(device_stub, "whole", ["gpu-1"])
    exp = await exporter_factory(socket_dir=str(runtime_sim.socket_dir))
    got = await exp.wait_for(has(CONTAINER_UTIL, pod="large"))
    device = one(got, UTIL, device="gpu-0")
    small, large = one(got, CONTAINER_UTIL, pod="small"), one(got, CONTAINER_UTIL, pod="large")
    assert 0 < small <= 0.3 < large <= 0.7
    assert small + large == pytest.approx(device, rel=0.05)
    assert (one(got, CORE, pod="small"), one(got, CORE, pod="large")) == (0.3, 0.7)
    # measured per allocation a moment apart from the device sample: the same up to jitter
    whole = one(got, CONTAINER_UTIL, pod="whole")
    assert whole == pytest.approx(one(got, UTIL, device="gpu-1"), rel=0.05)
    assert one(got, "lj_runtimekit_runtime_info", version="v1.13.0") == 1.0
    assert len(got[UTIL]) == 8


async def test_a_released_allocation_leaves_at_the_next_poll(
    runtime_sim: Simulator, device_stub: Stub, exporter_factory: Factory
) -> None:
    alloc = await allocate(device_stub, "job", ["gpu-2"])
    exp = await exporter_factory(socket_dir=str(runtime_sim.socket_dir))
    await exp.wait_for(has(CORE, pod="job"))
    await device_stub.Release(device_pb2.ReleaseRequest(allocation_id=alloc))
    await exp.wait_for(lambda s: not has(CORE, pod="job")(s), deadline_s=2.0)


async def test_runtime_restart_drops_device_series_then_they_return_without_exporter_restart(
    runtime_sim: Simulator, exporter_factory: Factory
) -> None:
    exp = await exporter_factory(socket_dir=str(runtime_sim.socket_dir))
    await exp.wait_for(lambda s: up_is(1.0)(s) and UTIL in s)
    await runtime_sim.stop()
    got = await exp.wait_for(up_is(0.0))
    assert UTIL not in got, "device numbers must not be served while the Runtime is away"
    assert one(got, "lj_runtimekit_exporter_collection_errors_total", source="runtime") >= 1
    await runtime_sim.start()
    got = await exp.wait_for(lambda s: up_is(1.0)(s) and UTIL in s, deadline_s=10.0)
    assert len(got[UTIL]) == 8


async def test_an_older_runtime_without_allocation_methods_still_gives_device_metrics(
    runtime_sim_factory: Factory, exporter_factory: Factory
) -> None:
    sim = await runtime_sim_factory(
        capabilities=[
            "DeviceService.GetVersion",
            "DeviceService.ListDevices",
            "MonitorService.GetDeviceMetrics",
        ]
    )
    exp = await exporter_factory(socket_dir=str(sim.socket_dir))
    got = await exp.wait_for(lambda s: UTIL in s)
    missing = {labels["method"] for labels, _ in got["lj_runtimekit_runtime_method_missing"]}
    assert missing == {"DeviceService.ListAllocations", "MonitorService.GetAllocationUsage"}
    assert CORE not in got


async def test_a_runtime_without_device_metrics_still_gives_inventory_and_health(
    runtime_sim_factory: Factory, exporter_factory: Factory
) -> None:
    sim = await runtime_sim_factory(
        capabilities=["DeviceService.GetVersion", "DeviceService.ListDevices"]
    )
    exp = await exporter_factory(socket_dir=str(sim.socket_dir))
    got = await exp.wait_for(has("lj_runtimekit_device_healthy", device="gpu-7"))
    assert values(got, UP) == [1.0]
    assert UTIL not in got
    missing = {labels["method"] for labels, _ in got["lj_runtimekit_runtime_method_missing"]}
    assert "MonitorService.GetDeviceMetrics" in missing


async def test_a_mig_partition_holder_is_attributed_with_its_partition(
    runtime_sim_factory: Factory, exporter_factory: Factory
) -> None:
    sim = await runtime_sim_factory(inventory="mig-tdm")
    part = next(p.id for d in sim.devices() if d.id == "gpu-1" for p in d.partitions)
    async with grpc.aio.insecure_channel(sim.target("DeviceService")) as ch:
        await allocate(Stub(ch), "mig", [part])
    exp = await exporter_factory(socket_dir=str(sim.socket_dir))
    got = await exp.wait_for(has(CONTAINER_UTIL, pod="mig"))
    util = one(got, CONTAINER_UTIL, pod="mig", device="gpu-1", partition=part)
    partition_util = one(got, "lj_runtimekit_partition_utilization_ratio", partition=part)
    assert util == pytest.approx(partition_util, rel=0.05)
    assert util > 0


async def test_unhealthy_device_reads_zero_healthy_at_the_next_poll(
    runtime_sim: Simulator, exporter_factory: Factory
) -> None:
    exp = await exporter_factory(socket_dir=str(runtime_sim.socket_dir))
    await exp.wait_for(has("lj_runtimekit_device_healthy", device="gpu-3"))
    runtime_sim.set_health("gpu-3", False, "XID 79: GPU has fallen off the bus")
    got = await exp.wait_for(
        lambda s: values(s, "lj_runtimekit_device_healthy", device="gpu-3") == [0.0]
    )
    assert one(got, "lj_runtimekit_device_last_xid", device="gpu-3") == 79.0


async def test_a_slow_runtime_call_times_out_and_is_counted_not_hung(
    runtime_sim: Simulator, exporter_factory: Factory
) -> None:
    runtime_sim.fail("MonitorService.GetDeviceMetrics", None, delay_s=1.0)
    exp = await exporter_factory(socket_dir=str(runtime_sim.socket_dir), rpc_timeout=0.2)
    got = await exp.wait_for(up_is(0.0))
    assert UTIL not in got
    assert values(got, "lj_runtimekit_exporter_collection_errors_total", source="runtime")[0] >= 1
    runtime_sim.clear_faults()
    await exp.wait_for(up_is(1.0), deadline_s=10.0)


def kubelet_pod(name: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}"},
        "status": {"phase": phase},
    }


async def test_kubelet_pods_terminated_or_gone_pods_leave_at_the_next_poll(
    runtime_sim: Simulator,
    device_stub: Stub,
    kubelet_emulator: KubeletEmulator,
    exporter_factory: Factory,
) -> None:
    for i, name in enumerate(("a", "b", "c")):
        await allocate(device_stub, name, [f"gpu-{i}"])
    kubelet_emulator.set_pods([kubelet_pod("a"), kubelet_pod("b"), kubelet_pod("c")])
    exp = await exporter_factory(
        socket_dir=str(runtime_sim.socket_dir),
        pods_source="kubelet",
        kubelet_pods_url=kubelet_emulator.pods_url,
    )
    await exp.wait_for(lambda s: pods(s) == {"a", "b", "c"})
    kubelet_emulator.set_pods([kubelet_pod("a"), kubelet_pod("b", "Succeeded")])
    got = await exp.wait_for(lambda s: pods(s) == {"a"}, deadline_s=2.0)
    assert values(got, "lj_runtimekit_exporter_pods_source_up", source="kubelet") == [1.0]


def pods(series: dict[str, Any]) -> set[str]:
    return {labels["pod"] for labels, _ in series.get(CORE, [])}
