"""The emulator's pod-resources API v1, as the kubelet serves it (server_v1.go, 1.37)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc import aio

from lj_runtimekit_interface.podresources.v1 import api_pb2 as pb
from lj_runtimekit_interface.podresources.v1 import api_pb2_grpc as pbgrpc
from lj_runtimekit_interface.sockets import unix_target
from lj_runtimekit_testkit.kubelet import KubeletEmulator
from lj_runtimekit_testkit.kubelet.sample_plugin import SampleDevicePlugin

from .test_registration import eventually

RES = "example.com/dev"


def _pod(name: str, uid: str, containers: dict[str, int], phase: str = "Running") -> Any:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {
            "containers": [
                {"name": c, "resources": {"limits": {RES: str(n)} if n else {}}}
                for c, n in containers.items()
            ],
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always"},
                {"name": "setup"},
            ],
        },
        "status": {"phase": phase},
    }


def _listed(r: pb.ListPodResourcesResponse) -> dict[str, dict[str, list[str]]]:
    return {
        p.name: {c.name: sorted(i for d in c.devices for i in d.device_ids) for c in p.containers}
        for p in r.pod_resources
    }


async def test_list_names_active_pods_all_containers_and_devices_after_allocate_returns(
    kubelet_emulator: KubeletEmulator,
) -> None:
    k = kubelet_emulator
    plugin = SampleDevicePlugin(k.plugin_dir, RES, 4)
    await plugin.start()
    async with aio.insecure_channel(unix_target(k.pod_resources_socket)) as ch:
        stub = pbgrpc.PodResourcesListerStub(ch)
        try:
            await eventually("devices", lambda: len(k.devices(RES)) == 4)
            a = _pod("a", "uid-a", {"gpu": 2, "plain": 0})
            done = _pod("done", "uid-d", {"gpu": 1}, phase="Succeeded")
            k.set_pods([a, done])
            plugin.allocate_delay_s = 0.5
            admit = asyncio.create_task(k.admit(a))
            await eventually("Allocate called", lambda: not plugin.allocate_calls, 1.0)
            await asyncio.sleep(0.2)
            # Allocate has not returned: the container exists, its devices are not recorded yet
            got = _listed(await stub.List(pb.ListPodResourcesRequest()))
            assert got == {"a": {"sidecar": [], "gpu": [], "plain": []}}
            await admit
            r = await stub.List(pb.ListPodResourcesRequest())
            got = _listed(r)
            assert len(got["a"]["gpu"]) == 2
            assert got["a"]["plain"] == []
            # one ContainerDevices per device, as the kubelet builds them
            gpu = next(c for c in r.pod_resources[0].containers if c.name == "gpu")
            assert all(len(d.device_ids) == 1 and d.resource_name == RES for d in gpu.devices)
            one = await stub.Get(pb.GetPodResourcesRequest(pod_name="a", pod_namespace="ns"))
            assert _listed(pb.ListPodResourcesResponse(pod_resources=[one.pod_resources])) == got
            # the pod ends: it drops out, and its devices are free for the next
            a["status"]["phase"] = "Failed"
            assert _listed(await stub.List(pb.ListPodResourcesRequest())) == {}
        finally:
            await plugin.stop()


async def test_get_of_an_unknown_pod_fails_with_the_kubelets_message(
    kubelet_emulator: KubeletEmulator,
) -> None:
    async with aio.insecure_channel(unix_target(kubelet_emulator.pod_resources_socket)) as ch:
        stub = pbgrpc.PodResourcesListerStub(ch)
        with pytest.raises(aio.AioRpcError) as e:
            await stub.Get(pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="ns"))
    # a plain Go error in the kubelet: grpc-go sends it as UNKNOWN
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert e.value.details() == "pod nope in namespace ns not found"


async def test_allocatable_lists_healthy_devices_and_the_socket_follows_restarts(
    kubelet_emulator: KubeletEmulator,
) -> None:
    k = kubelet_emulator
    plugin = SampleDevicePlugin(k.plugin_dir, RES, 3)
    await plugin.start()
    try:
        await eventually("devices", lambda: len(k.devices(RES)) == 3)
        plugin.set_health("dev-1", healthy=False)
        await eventually("unhealthy", lambda: k.devices(RES).get("dev-1") == "Unhealthy")
        async with aio.insecure_channel(unix_target(k.pod_resources_socket)) as ch:
            stub = pbgrpc.PodResourcesListerStub(ch)
            r = await stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
            assert sorted(i for d in r.devices for i in d.device_ids) == ["dev-0", "dev-2"]
        await k.restart()
        async with aio.insecure_channel(unix_target(k.pod_resources_socket)) as ch:
            stub = pbgrpc.PodResourcesListerStub(ch)
            assert (await stub.List(pb.ListPodResourcesRequest(), timeout=5)).pod_resources == []
    finally:
        await plugin.stop()
