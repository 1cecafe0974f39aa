"""Against the real apiserver: NodeDevices on change only, and the shared-GPU handshake race."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client, config

from lj_runtimekit_device_plugin.deviceplugin.assignment import ALLOCATED, ASSIGNMENT
from lj_runtimekit_device_plugin.deviceplugin.handshake import SharedHandshake
from lj_runtimekit_device_plugin.kube import MarkUpdate, Publisher, mark_pod, node_pods
from lj_runtimekit_device_plugin.nodedevices import GROUP, PLURAL, VERSION
from lj_runtimekit_device_plugin.podview import PodView, pod_view
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient
from lj_runtimekit_testkit.cluster.crds import installed_crd

pytestmark = pytest.mark.cluster

CRD = Path(__file__).parents[3] / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
CORE = "aliyun.com/gpu-core"


@pytest.fixture(scope="module")
def crd(cluster: Any) -> Iterator[None]:
    """The NodeDevices CRD as deploy/ ships it, established, for this file."""
    with installed_crd(cluster, CRD):
        yield


@pytest_asyncio.fixture
async def api(cluster: Any) -> AsyncIterator[client.ApiClient]:
    api = await config.new_client_from_config(config_file=cluster.kubeconfig)
    try:
        yield api
    finally:
        await api.close()


async def test_nodedevices_published_on_change_only(
    cluster: Any, crd: None, api: client.ApiClient, runtime_sim: Any
) -> None:
    node = cluster.create_gpu_nodes(1, prefix="dp-nd")[0]
    rt = RuntimeClient(str(runtime_sim.socket_dir))
    devices, info = await rt.list_devices(), await rt.version()
    pub = Publisher(api, node)
    assert await pub.publish(devices, info)
    assert not await pub.publish(devices, info)
    assert pub.writes == 1
    obj = await client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, node)
    assert obj["status"]["deviceCount"] == 8
    assert obj["status"]["healthyCount"] == 8
    sick = [dataclasses.replace(devices[0], healthy=False, reason="XID 79"), *devices[1:]]
    assert await pub.publish(sick, info)
    obj = await client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, node)
    assert obj["status"]["healthyCount"] == 7
    labels = (await client.CoreV1Api(api).read_node(node)).metadata.labels
    assert labels["lj-runtimekit.aliyun.com/count"] == "8"
    await rt.close()


def _pod(name: str, node: str, gpu: str, at: str, core: int = 30) -> dict[str, Any]:
    assignment = {
        "version": "v1",
        "node": node,
        "assumedAt": at,
        "containers": [{"name": "main", "devices": [{"id": gpu, "core": core}]}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ASSIGNMENT: json.dumps(assignment)}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {CORE: str(core)}}}
            ],
            "tolerations": [{"operator": "Exists"}],
        },
    }


async def test_two_shared_pods_started_at_once_by_two_replicas_get_their_own_decisions(
    cluster: Any, api: client.ApiClient, namespace: str, runtime_sim: Any
) -> None:
    """Two pending pods (the scheduler never leaves two of one shape pending on a node), two
    plugin replicas, two Allocates at the same moment, in both orders: each pod gets its own
    decision, once. Nothing here releases allocations: earlier rounds' pods are left to the
    product (this test runs no reclaimer), so only this round's are compared."""
    node = cluster.create_gpu_nodes(1, prefix="dp-race")[0]
    core = client.CoreV1Api(api)
    rt = RuntimeClient(str(runtime_sim.socket_dir))

    async def list_pods() -> list[PodView]:
        return [v for p in await node_pods(api, node) if (v := pod_view(p)) is not None]

    async def mark(pod: PodView, update: MarkUpdate) -> None:
        await mark_pod(api, pod.namespace, pod.name, pod.uid, update)

    for round_ in range(10):
        wanted = {
            f"r{round_}-a": (f"gpu-{round_ % 8}", 30),
            f"r{round_}-b": (f"gpu-{(round_ + 4) % 8}", 20),
        }
        uids = {}
        for k, (name, (gpu, c)) in enumerate(wanted.items()):
            body: Any = _pod(name, node, gpu, f"2026-12-03T00:00:0{k}Z", c)
            uids[name] = (await core.create_namespaced_pod(namespace, body)).metadata.uid
        hs = [SharedHandshake(rt, ResourceNames(), node, list_pods, mark) for _ in range(2)]
        sizes = [30, 20] if round_ % 2 else [20, 30]
        await asyncio.gather(
            *(
                h.allocate(CORE, [f"gpu-0::core-{i}" for i in range(n)])
                for h, n in zip(hs, sizes, strict=True)
            )
        )
        marked = {}
        for name in wanted:
            pod = await core.read_namespaced_pod(name, namespace)
            assert ALLOCATED in pod.metadata.annotations
            marked[name] = pod.metadata.annotations["lj-runtimekit-device-plugin/allocation"]
        assert len(set(marked.values())) == 2
        held = {
            a.pod.name: (a.device_ids[0], a.core_percent)
            for a in runtime_sim.allocations()
            if a.pod.uid in uids.values()
        }
        assert held == wanted
        for name in wanted:
            await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    await rt.close()
