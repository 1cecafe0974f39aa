"""The whole device plugin on an emulated node of the real apiserver while 2 of its 8 GPUs are
bound to vfio-pci and back: the node's allocatable, its vfio.count label and its NodeDevices
object (the CRD's schema keeps each device's binding) follow (issue 22, item 2). And while 2 are
fenced by the controller for a partition layout change (issue 39): the same three show exactly
those withheld, a fence recorded before the plugin started too, and back once it goes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as sync_client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.nodedevices import DEFAULT_LABEL_PREFIX, GROUP, PLURAL, VERSION
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.cluster.crds import installed_crd
from lj_runtimekit_testkit.simulator.clients import runtime_clients

pytestmark = pytest.mark.cluster

CRD = Path(__file__).parents[3] / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
OLD = DEFAULT_LABEL_PREFIX


@pytest.fixture(scope="module")
def crd(cluster: Any) -> Iterator[None]:
    """The NodeDevices CRD as deploy/ ships it, established."""
    with installed_crd(cluster, CRD):
        yield


@asynccontextmanager
async def plugin(cluster: Any, node: Any) -> AsyncIterator[None]:
    s = load(
        [
            f"--socket-dir={node.simulator.socket_dir}",
            f"--plugin-dir={node.plugin_dir}",
            "--metrics-bind-address=127.0.0.1:0",
            f"--node-name={node.name}",
            f"--kubeconfig={cluster.kubeconfig}",
            "--pods-source=apiserver",
            f"--pod-resources-socket={node.emulator.pod_resources_socket}",
        ],
        {},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(s, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def _state(cluster: Any, name: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(allocatable, our labels, device id → binding in NodeDevices) of node ``name``."""
    with cluster.api_client() as api:
        node = sync_client.CoreV1Api(api).read_node(name)
        obj: Any
        try:
            obj = sync_client.CustomObjectsApi(api).get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name
            )
        except ApiException:
            obj = {}  # not written yet
    assert node.metadata is not None
    assert node.status is not None
    labels = {
        k.removeprefix(f"{OLD}/"): v
        for k, v in (node.metadata.labels or {}).items()
        if k.startswith(f"{OLD}/")
    }
    bindings = {d["id"]: d.get("binding", "") for d in (obj.get("status") or {}).get("devices", [])}
    return dict(node.status.allocatable or {}), labels, bindings


async def _until(
    cluster: Any, name: str, cond: Callable[[dict[str, str], dict[str, str], dict[str, str]], bool]
) -> None:
    deadline = time.monotonic() + 30
    while not cond(*(state := _state(cluster, name))):
        assert time.monotonic() < deadline, f"node {name}: {state}"
        await asyncio.sleep(0.2)


async def _bind(sim: Any, binding: int) -> None:
    async with runtime_clients(sim) as c:
        for gpu in ("gpu-6", "gpu-7"):
            await c.config.SetDeviceBinding(
                cpb.SetDeviceBindingRequest(device_id=gpu, binding=binding)  # type: ignore[arg-type]
            )


async def test_two_gpus_bound_to_vfio_show_on_the_node_and_its_nodedevices(
    cluster: Any, crd: None, emulated_gpu_node: Any
) -> None:
    node = emulated_gpu_node  # gpu-8x-nvlink
    async with plugin(cluster, node):
        await _until(
            cluster,
            node.name,
            lambda alloc, labels, bindings: (
                alloc.get("aliyun.com/gpu") == "8"
                and labels.get("vfio.count") == "0"
                and set(bindings.values()) == {"DRIVER"}
            ),
        )
        await _bind(node.simulator, pb.DEVICE_BINDING_VFIO)
        await _until(
            cluster,
            node.name,
            lambda alloc, labels, bindings: (
                alloc.get("aliyun.com/gpu") == "6"
                and alloc.get("aliyun.com/gpu-vfio") == "2"
                and alloc.get("aliyun.com/gpu-core") == "600"
                and labels.get("vfio.count") == "2"
                and labels.get("count") == "8"
                and {k for k, v in bindings.items() if v == "VFIO"} == {"gpu-6", "gpu-7"}
            ),
        )
        await _bind(node.simulator, pb.DEVICE_BINDING_DRIVER)
        await _until(
            cluster,
            node.name,
            lambda alloc, labels, bindings: (
                alloc.get("aliyun.com/gpu") == "8"
                and alloc.get("aliyun.com/gpu-vfio", "0") == "0"
                and labels.get("vfio.count") == "0"
                and set(bindings.values()) == {"DRIVER"}
            ),
        )


FENCE = "lj-runtimekit-controller/partition-fence"


def _annotate(cluster: Any, name: str, value: str | None) -> None:
    with cluster.api_client() as api:
        sync_client.CoreV1Api(api).patch_node(name, {"metadata": {"annotations": {FENCE: value}}})


def _fenced(cluster: Any, name: str) -> dict[str, str]:
    with cluster.api_client() as api:
        obj: Any = sync_client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP, VERSION, PLURAL, name
        )
    return {d["id"]: d.get("fenced", "") for d in obj["status"]["devices"] if not d["healthy"]}


async def test_gpus_fenced_for_a_layout_change_are_withheld_from_the_start_and_given_back(
    cluster: Any, crd: None, emulated_gpu_node: Any
) -> None:
    node = emulated_gpu_node  # gpu-8x-nvlink
    fence = (
        '{"layout":"mig-2","digest":"d","devices":["gpu-0","gpu-1"],'
        '"heldBy":["gpu-1 by team/train/main (a-1)"]}'
    )
    # Recorded before the plugin starts (as after a restart mid-change): read before registering.
    _annotate(cluster, node.name, fence)
    async with plugin(cluster, node):
        await _until(
            cluster,
            node.name,
            lambda alloc, labels, bindings: (
                alloc.get("aliyun.com/gpu") == "6" and alloc.get("aliyun.com/gpu-core") == "600"
            ),
        )
        fenced = _fenced(cluster, node.name)
        assert sorted(fenced) == ["gpu-0", "gpu-1"]
        assert "mig-2" in fenced["gpu-1"]
        assert "team/train/main" in fenced["gpu-1"]
        # Lifted: all eight serve again.
        _annotate(cluster, node.name, None)
        await _until(
            cluster, node.name, lambda alloc, labels, bindings: alloc.get("aliyun.com/gpu") == "8"
        )
        assert _fenced(cluster, node.name) == {}
        # Fenced while running: the watch brings it.
        _annotate(cluster, node.name, fence.replace('"gpu-0",', ""))
        await _until(
            cluster, node.name, lambda alloc, labels, bindings: alloc.get("aliyun.com/gpu") == "7"
        )
    _annotate(cluster, node.name, None)
