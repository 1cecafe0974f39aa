"""The whole device plugin on an emulated node of the real apiserver: the node carries the labels
of the Runtime's driver facts, and a restart under a renamed prefix moves them (issue 22)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as sync_client

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.nodedevices import PREFIX_LABEL
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_testkit.cluster.crds import installed_crd

pytestmark = pytest.mark.cluster

CRD = Path(__file__).parents[3] / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
OLD, NEW = "lj-runtimekit.aliyun.com", "gpu.example.com"


@pytest.fixture(scope="module")
def crd(cluster: Any) -> Iterator[None]:
    """The NodeDevices CRD as deploy/ ships it, established, for this file."""
    with installed_crd(cluster, CRD):
        yield


@asynccontextmanager
async def plugin(cluster: Any, node: Any, prefix: str) -> AsyncIterator[None]:
    s = load(
        [
            f"--socket-dir={node.simulator.socket_dir}",
            f"--plugin-dir={node.plugin_dir}",
            "--metrics-bind-address=127.0.0.1:0",
            f"--node-name={node.name}",
            f"--kubeconfig={cluster.kubeconfig}",
            "--pods-source=apiserver",
            f"--pod-resources-socket={node.emulator.pod_resources_socket}",
            f"--node-label-prefix={prefix}",
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


def node_meta(cluster: Any, name: str) -> Any:
    with cluster.api_client() as api:
        meta = sync_client.CoreV1Api(api).read_node(name).metadata
    assert meta is not None
    return meta


async def until(cluster: Any, name: str, cond: Callable[[dict[str, str]], bool]) -> dict[str, str]:
    """The node's labels once ``cond`` holds for them (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        labels = dict(node_meta(cluster, name).labels or {})
        if cond(labels):
            return labels
        assert time.monotonic() < deadline, f"node {name} labels: {labels}"
        await asyncio.sleep(0.2)


async def test_the_node_carries_the_driver_labels_and_a_renamed_prefix_moves_them(
    cluster: Any, crd: None, emulated_gpu_node: Any
) -> None:
    node = emulated_gpu_node  # gpu-8x-nvlink: 8 NVIDIA H800, the simulator's default driver
    async with plugin(cluster, node, OLD):
        labels = await until(cluster, node.name, lambda ls: f"{OLD}/compute.major" in ls)
    assert labels[f"{OLD}/count"] == "8"
    assert labels[f"{OLD}/driver-version"] == "550.54.15"
    assert labels[f"{OLD}/compute.major"] == "9"
    assert labels[f"{OLD}/compute.minor"] == "0"
    assert labels[f"{OLD}/mig.capable"] == "true"
    assert labels[f"{OLD}/sharing-mode"] == "core-memory"
    assert labels[PREFIX_LABEL] == OLD

    async with plugin(cluster, node, NEW):
        labels = await until(cluster, node.name, lambda ls: ls.get(PREFIX_LABEL) == NEW)
    assert labels[f"{NEW}/driver-version"] == "550.54.15"
    assert labels[f"{NEW}/count"] == "8"
    assert not [k for k in labels if k.startswith(f"{OLD}/") and k != PREFIX_LABEL], labels
    assert labels["lj_runtimekit_enable"] == "true"  # not ours: kept
    # the plugin's admission policy lets it change labels only: no annotation of ours
    notes = node_meta(cluster, node.name).annotations or {}
    assert not [k for k in notes if k.startswith(f"{OLD}/")], notes
