"""A node moved from the device plugin to DRA with a GPU pod running, on the real apiserver: the
whole daemon first in mode device-plugin (the kubelet emulator admits a pod holding one GPU),
then in mode dra on the same Runtime simulator. The pod's GPU is published tainted
``held-by-device-plugin`` from the first write (the apiserver accepts the taint), the others
untainted; the pod's allocation stays while pod-resources lists it; when the pod ends its
allocation is released and the taint goes. Docs: docs/dra.md, "Migrating a node"."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as sync_client

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.dra.publish import GROUP, PLURAL, VERSION
from lj_runtimekit_device_plugin.dra.slices import DEFAULT_DRIVER
from lj_runtimekit_device_plugin.handover import HELD_TAINT_KEY
from lj_runtimekit_device_plugin.settings import Settings, load
from lj_runtimekit_testkit.kubelet import KubeletEmulator

pytestmark = pytest.mark.cluster

GPU = "aliyun.com/gpu"


async def _until(cond: Callable[[], bool], within_s: float = 60.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"{what or 'condition'} not met"
        await asyncio.sleep(0.1)


@pytest.fixture
def node(cluster: Any) -> Iterator[str]:
    (name,) = cluster.create_gpu_nodes(1, prefix="migrate", wait_ready=False)
    yield name
    with cluster.api_client() as a:
        custom = sync_client.CustomObjectsApi(a)
        for s in _slices(cluster, name):
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, s["metadata"]["name"])
        sync_client.CoreV1Api(a).delete_node(name)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mig-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _slices(cluster: Any, node: str) -> list[dict[str, Any]]:
    with cluster.api_client() as a:
        got: Any = sync_client.CustomObjectsApi(a).list_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            field_selector=f"spec.nodeName={node},spec.driver={DEFAULT_DRIVER}",
        )
    items: list[dict[str, Any]] = got["items"]
    return items


def _taints(cluster: Any, node: str) -> dict[str, list[dict[str, Any]]]:
    """Runtime device id → its taints, for every published device."""
    return {
        d["attributes"]["runtimeDeviceID"]["string"]: d.get("taints", [])
        for s in _slices(cluster, node)
        for d in s["spec"].get("devices", [])
    }


def _settings(
    k: KubeletEmulator, sim: Any, node: str, dirs: Path, cluster: Any, *mode: str
) -> Settings:
    return load(
        [
            *("--socket-dir", str(sim.socket_dir), "--plugin-dir", k.plugin_dir),
            *("--port", "0", "--node-name", node, "--pods-source", "kubelet"),
            *("--kubelet-pods-url", k.pods_url, "--pod-resources-socket", k.pod_resources_socket),
            *("--reconcile-interval", "0.3", "--release-grace", "0.3"),
            *("--publish-inventory", "false", "--kubeconfig", str(cluster.kubeconfig)),
            *("--dra-plugin-dir", str(dirs / "plugins"), "--dra-registry-dir", str(dirs / "reg")),
            *("--cdi-dir", str(dirs / "cdi"), *mode),
        ],
        {},
    )


async def test_a_device_plugin_pod_keeps_its_gpu_tainted_in_dra_mode_until_it_ends(
    cluster: Any, node: str, kubelet_emulator: KubeletEmulator, runtime_sim: Any, short_dir: Path
) -> None:
    k = kubelet_emulator
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "ns", "name": "old", "uid": uuid.uuid4().hex},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {GPU: "1"}}}]},
        "status": {"phase": "Running"},
    }
    stop = asyncio.Event()
    daemon = asyncio.create_task(serve(_settings(k, runtime_sim, node, short_dir, cluster), stop))
    try:
        await _until(lambda: len(k.devices(GPU)) == 8, what="registration")
        k.set_pods([pod])
        await k.admit(pod)
    finally:
        stop.set()
        await asyncio.wait_for(daemon, 10)
    (held,) = runtime_sim.allocations()
    (gpu,) = held.device_ids
    assert not _slices(cluster, node)

    # relabelled: the same node in mode dra
    stop = asyncio.Event()
    dra = _settings(k, runtime_sim, node, short_dir, cluster, "--mode", "dra")
    daemon = asyncio.create_task(serve(dra, stop))
    try:
        await _until(lambda: len(_taints(cluster, node)) == 8, what="eight GPUs published")
        # from the first write on (an allocation whose pod was not known at Allocate is
        # tainted with its provisional owner until the reconciler re-owns it to its pod)
        assert [d for d, t in _taints(cluster, node).items() if t] == [gpu]
        want = {"key": HELD_TAINT_KEY, "value": "ns.old", "effect": "NoSchedule"}
        await _until(
            lambda: [{k: t[k] for k in want} for t in _taints(cluster, node)[gpu]] == [want],
            what="the held taint naming the pod",
        )
        assert [d for d, t in _taints(cluster, node).items() if t] == [gpu]
        await asyncio.sleep(1.5)  # passes: the pod-resources listing keeps it held
        assert [a.id for a in runtime_sim.allocations()] == [held.id]
        k.set_pods([])  # the pod ends
        await _until(lambda: runtime_sim.allocations() == [], what="its allocation released")
        await _until(lambda: not _taints(cluster, node)[gpu], what="the taint cleared")
    finally:
        stop.set()
        await asyncio.wait_for(daemon, 10)
