"""The emulator on a real (KWOK) node: capacity in the apiserver, Allocate for a bound pod."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from kubernetes import client

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.kubelet import KubeletEmulator
from lj_runtimekit_testkit.kubelet.fixtures import EmulatedGpuNode
from lj_runtimekit_testkit.kubelet.sample_plugin import SampleDevicePlugin

pytestmark = pytest.mark.cluster
RESOURCE = "example.com/dev"


async def eventually(what: str, check: Callable[[], bool], deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s} s")
        await asyncio.sleep(0.1)


@pytest_asyncio.fixture
async def emulated(cluster: Cluster) -> AsyncIterator[KubeletEmulator]:
    node = cluster.create_gpu_nodes(1, prefix="emulated", gpus=0)[0]
    plugin_dir = tempfile.mkdtemp(prefix="kubelet-")
    emulator = KubeletEmulator(node, plugin_dir, cluster, stop_grace_s=1.0)
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def _allocatable(core: client.CoreV1Api, node: str) -> tuple[str | None, str | None]:
    status = core.read_node(node).status
    assert status is not None
    return (status.capacity or {}).get(RESOURCE), (status.allocatable or {}).get(RESOURCE)


async def test_devices_become_node_capacity_and_a_bound_pod_is_allocated(
    cluster: Cluster, namespace: str, emulated: KubeletEmulator
) -> None:
    core = cluster.core()
    node = emulated.node_name
    plugin = SampleDevicePlugin(emulated.plugin_dir, RESOURCE, 4)
    await plugin.start()
    try:
        await eventually("capacity 4", lambda: _allocatable(core, node) == ("4", "4"))
        plugin.set_health("dev-0", healthy=False)
        await eventually("allocatable 3", lambda: _allocatable(core, node) == ("4", "3"))

        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="wants-dev"),
            spec=client.V1PodSpec(
                node_selector={"kubernetes.io/hostname": node},
                containers=[
                    client.V1Container(
                        name="main",
                        image="busybox",
                        resources=client.V1ResourceRequirements(limits={RESOURCE: "2"}),
                    )
                ],
            ),
        )
        core.create_namespaced_pod(namespace, pod)
        await eventually("Allocate called", lambda: len(plugin.allocate_calls) == 1)
        assert len(plugin.allocate_calls[0]) == 2
        assert "dev-0" not in plugin.allocate_calls[0]
        record = emulated.allocations[0]
        assert record.pod == f"{namespace}/wants-dev"
        assert record.container == "main"

        await plugin.stop()
        await eventually("resource zeroed", lambda: _allocatable(core, node) == ("0", "0"))
    finally:
        await plugin.stop()


async def test_restart_makes_the_plugin_register_again_and_capacity_returns(
    cluster: Cluster, emulated: KubeletEmulator
) -> None:
    core = cluster.core()
    plugin = SampleDevicePlugin(emulated.plugin_dir, RESOURCE, 2)
    await plugin.start()
    try:
        await eventually("capacity 2", lambda: _allocatable(core, emulated.node_name) == ("2", "2"))
        await emulated.restart()
        await eventually("registered again", lambda: plugin.registrations == 2)
        await eventually("capacity 2", lambda: _allocatable(core, emulated.node_name) == ("2", "2"))
    finally:
        await plugin.stop()


async def test_emulated_gpu_node_fixture_gives_a_node_a_simulator_and_an_emulator(
    cluster: Cluster, emulated_gpu_node: EmulatedGpuNode
) -> None:
    node = cluster.core().read_node(emulated_gpu_node.name)
    assert node.metadata is not None
    assert node.metadata.labels is not None
    assert node.metadata.labels["lj_runtimekit_enable"] == "true"
    assert emulated_gpu_node.emulator.node_name == emulated_gpu_node.name
    assert (emulated_gpu_node.simulator.socket_dir / "device-daemon.sock").exists()
