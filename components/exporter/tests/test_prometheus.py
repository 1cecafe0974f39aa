"""A real Prometheus (Debian's package) scrapes the exporter backed by the runtime simulator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc
from lj_runtimekit_testkit.kubelet.emulator import KubeletEmulator
from lj_runtimekit_testkit.simulator.simulator import Simulator

pytestmark = pytest.mark.prometheus
GiB = 2**30
Factory = Callable[..., Awaitable[Any]]
Result = list[dict[str, Any]]


def value(result: Result) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def one_series(result: Result) -> bool:
    return len(result) == 1


def kubelet_pod(name: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": "emulated-node", "containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }


async def test_prometheus_sees_device_and_pod_series_and_staleness_across_a_runtime_restart(
    runtime_sim: Simulator,
    kubelet_emulator: KubeletEmulator,
    exporter_factory: Factory,
    prometheus_factory: Factory,
) -> None:
    kubelet_emulator.set_pods([kubelet_pod("train-0"), kubelet_pod("train-1")])
    async with grpc.aio.insecure_channel(runtime_sim.target("DeviceService")) as ch:
        stub = device_pb2_grpc.DeviceServiceStub(ch)
        for pod, core in (("train-0", 30), ("train-1", 70)):
            await stub.Allocate(
                device_pb2.AllocateRequest(
                    pod=device_pb2.PodRef(namespace="team", name=pod, uid=f"uid-{pod}"),
                    container="main",
                    resource_name="aliyun.com/gpu-core",
                    device_ids=["gpu-0"],
                    core_percent=core,
                    memory_bytes=8 * GiB,
                )
            )
    exp = await exporter_factory(
        socket_dir=str(runtime_sim.socket_dir),
        poll_interval=0.2,
        pods_source="kubelet",
        kubelet_pods_url=kubelet_emulator.pods_url,
    )
    prom = await prometheus_factory([f"127.0.0.1:{exp.exporter.port}"])

    util = await prom.wait_for('lj_runtimekit_device_utilization_ratio{device="gpu-0"}', one_series)
    assert 0.5 < value(util) <= 1.0
    share = await prom.wait_for(
        'lj_runtimekit_container_allocated_core_ratio{namespace="team",pod="train-0"}', one_series
    )
    assert value(share) == 0.3
    own = await prom.wait_for(
        'lj_runtimekit_container_utilization_ratio{pod="train-0",container="main"}', one_series
    )
    assert 0 < value(own) <= 0.3, "the pod's own use, not the device's value copied"
    total = await prom.query(
        'sum(lj_runtimekit_container_utilization_ratio{device="gpu-0"})'
        ' / on() lj_runtimekit_device_utilization_ratio{device="gpu-0"}'
    )
    assert value(total) == pytest.approx(1.0, abs=0.1)

    kubelet_emulator.set_pods([kubelet_pod("train-0"), kubelet_pod("train-1", "Succeeded")])
    gone = 'lj_runtimekit_container_utilization_ratio{pod="train-1"}'
    await prom.wait_for(gone, lambda r: r == [])
    assert len(await prom.query('lj_runtimekit_container_utilization_ratio{pod="train-0"}')) == 1

    await runtime_sim.stop()
    await prom.wait_for("lj_runtimekit_runtime_up == 0", one_series)
    await prom.wait_for("lj_runtimekit_device_utilization_ratio", lambda r: r == [])
    assert await prom.query("lj_runtimekit_container_utilization_ratio") == []

    await runtime_sim.start()
    await prom.wait_for("lj_runtimekit_runtime_up == 1", one_series)
    back = await prom.wait_for("lj_runtimekit_device_utilization_ratio", lambda r: len(r) == 8)
    assert {s["metric"]["device"] for s in back} == {f"gpu-{i}" for i in range(8)}
