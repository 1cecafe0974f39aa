"""The exporter against a pod-resources server: a real gRPC server on a temp unix socket,
serving the kubelet's proto, beside the runtime simulator's real sockets."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_exporter.kubelet import PodResources, PodResourcesUnavailable
from lj_runtimekit_exporter.snapshot import Held
from lj_runtimekit_interface.podresources.v1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc
from lj_runtimekit_testkit.kubelet import KubeletEmulator
from lj_runtimekit_testkit.kubelet.sample_plugin import SampleDevicePlugin
from lj_runtimekit_testkit.simulator.simulator import Simulator

CORE = "lj_runtimekit_container_allocated_core_ratio"
SOURCE_UP = "lj_runtimekit_exporter_pods_source_up"
Factory = Callable[..., Awaitable[Any]]


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List with ``pods``: {(namespace, pod): {container: {resource: [device ids]}}}."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: Any
    ) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    namespace=ns,
                    name=name,
                    containers=[
                        api_pb2.ContainerResources(
                            name=c,
                            devices=[
                                api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in res.items()
                            ],
                        )
                        for c, res in containers.items()
                    ],
                )
                for (ns, name), containers in self.pods.items()
            ]
        )

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: Any
    ) -> api_pb2.GetPodResourcesResponse:
        return api_pb2.GetPodResourcesResponse()

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        return api_pb2.AllocatableResourcesResponse()


class Served:
    def __init__(self, socket: str) -> None:
        self.socket, self.kubelet = socket, Kubelet()
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self.kubelet, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None


@pytest.fixture
async def pod_resources() -> AsyncIterator[Served]:
    with tempfile.TemporaryDirectory(prefix="prs-") as d:  # unix socket paths are short
        served = Served(str(Path(d) / "kubelet.sock"))
        await served.start()
        yield served
        await served.stop()


async def test_the_client_reads_what_the_kubelet_lists(pod_resources: Served) -> None:
    pod_resources.kubelet.pods[("ns", "p")] = {
        "main": {"aliyun.com/gpu": ["gpu-0", "gpu-1"]},
        "side": {},
    }
    client = PodResources(pod_resources.socket, 2.0)
    await client.start()
    try:
        assert await client.held() == (
            Held("ns", "p", "main", "aliyun.com/gpu", ("gpu-0", "gpu-1")),
        )
        await pod_resources.stop()
        with pytest.raises(PodResourcesUnavailable, match=r"kubelet pod-resources .*UNAVAILABLE"):
            await client.held()
        await pod_resources.start()
        # back at a later poll without a new client (as the poller retries each interval)
        end = time.monotonic() + 10
        while True:
            try:
                assert len(await client.held()) == 1
                break
            except PodResourcesUnavailable:
                assert time.monotonic() < end, "pod-resources not found again"
                await asyncio.sleep(0.1)
    finally:
        await client.stop()


async def test_whole_gpus_recorded_without_a_pod_get_pod_labelled_series(
    runtime_sim: Simulator, pod_resources: Served, exporter_factory: Factory
) -> None:
    async with grpc.aio.insecure_channel(runtime_sim.target("DeviceService")) as ch:
        stub: Any = device_pb2_grpc.DeviceServiceStub(ch)
        for pod, devices in (("whole-gpu-1", ["gpu-1", "gpu-2"]), ("whole-gpu-3", ["gpu-3"])):
            await stub.Allocate(  # as the device plugin recorded whole GPUs before #18
                device_pb2.AllocateRequest(
                    pod=device_pb2.PodRef(
                        namespace="lj-runtimekit-unattributed", name=pod, uid=f"u-{pod}"
                    ),
                    container="main",
                    resource_name="aliyun.com/gpu",
                    device_ids=devices,
                )
            )
    pod_resources.kubelet.pods[("team", "train-4gpu")] = {
        "trainer": {"aliyun.com/gpu": ["gpu-2", "gpu-1"]}
    }
    pod_resources.kubelet.pods[("team", "gang-0")] = {"main": {"aliyun.com/gpu": ["gpu-3"]}}
    exp = await exporter_factory(
        socket_dir=str(runtime_sim.socket_dir),
        pod_resources_socket=pod_resources.socket,
        pods_source="kubelet",
        kubelet_pods_url="http://127.0.0.1:9/pods",  # nothing there: must not be needed
    )

    def series(s: dict[str, Any]) -> set[tuple[str, str, str, float]]:
        return {(lab["pod"], lab["container"], lab["device"], v) for lab, v in s.get(CORE, [])}

    got = await exp.wait_for(lambda s: len(series(s)) == 3)
    assert series(got) == {
        ("train-4gpu", "trainer", "gpu-1", 1.0),
        ("train-4gpu", "trainer", "gpu-2", 1.0),
        ("gang-0", "main", "gpu-3", 1.0),
    }
    assert [v for lab, v in got[SOURCE_UP] if lab["source"] == "pod-resources"] == [1.0]
    assert all(lab["source"] == "pod-resources" for lab, _ in got[SOURCE_UP])
    # the kubelet away: the fallback pod source is in use, and says it cannot read either
    await pod_resources.stop()
    got = await exp.wait_for(
        lambda s: (
            {(lab["source"], v) for lab, v in s.get(SOURCE_UP, [])}
            == {("pod-resources", 0.0), ("kubelet", 0.0)}
        )
    )


async def test_attribution_from_the_kubelet_emulator_s_pod_resources(
    kubelet_emulator: KubeletEmulator, runtime_sim: Simulator, exporter_factory: Factory
) -> None:
    k = kubelet_emulator
    plugin = SampleDevicePlugin(k.plugin_dir, "aliyun.com/gpu", 4)  # units gpu-0..gpu-3
    await plugin.start()
    try:
        await until(lambda: len(k.devices("aliyun.com/gpu")) == 4)
        pod: dict[str, Any] = {
            "metadata": {"namespace": "team", "name": "train", "uid": "uid-train"},
            "spec": {
                "containers": [
                    {"name": "trainer", "resources": {"limits": {"aliyun.com/gpu": "2"}}},
                    {"name": "sidecar"},
                ]
            },
            "status": {"phase": "Running"},
        }
        k.set_pods([pod])
        await k.admit(pod)
        exp = await exporter_factory(
            socket_dir=str(runtime_sim.socket_dir), pod_resources_socket=k.pod_resources_socket
        )
        got = await exp.wait_for(lambda s: len(s.get(CORE, [])) == 2)
        assert {(lab["pod"], lab["container"]) for lab, _ in got[CORE]} == {("train", "trainer")}
        assert {lab["device"] for lab, _ in got[CORE]} == set(plugin.allocate_calls[0])
        pod["status"]["phase"] = "Succeeded"  # the kubelet lists active pods only
        await exp.wait_for(lambda s: CORE not in s or not s[CORE])
    finally:
        await plugin.stop()


async def until(check: Callable[[], bool], deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, "not reached in time"
        await asyncio.sleep(0.05)
