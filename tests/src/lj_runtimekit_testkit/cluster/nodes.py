"""KWOK nodes with GPU capacity and network topology labels, created in bulk."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.launcher import KWOK_NODE_ANNOTATION

GPU = "aliyun.com/gpu"
GPU_CORE = "aliyun.com/gpu-core"
GPU_MEMORY = "aliyun.com/gpu-memory"
PPU = "alibabacloud.com/ppu"
FEATURE_LABEL = "lj_runtimekit_enable"
BLOCK_LABEL = "network.topology/block"
RACK_LABEL = "network.topology/rack"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
_ATTEMPTS = 5


@dataclass(frozen=True)
class NodeShape:
    """What one KWOK node offers; ``ppus`` > 0 adds ``alibabacloud.com/ppu``."""

    gpus: int = 8
    gpu_memory_gib: int = 80
    ppus: int = 0
    cpu: str = "128"
    memory: str = "1024Gi"
    pods: int = 110
    nodes_per_rack: int = 8
    racks_per_block: int = 4
    enable: bool = False
    taint: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    def capacity(self) -> dict[str, str]:
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus:
            cap[GPU] = str(self.gpus)
            cap[GPU_CORE] = str(100 * self.gpus)
            cap[GPU_MEMORY] = str(self.gpu_memory_gib * self.gpus)
        if self.ppus:
            cap[PPU] = str(self.ppus)
        return cap


def node_manifest(name: str, index: int, shape: NodeShape) -> dict[str, Any]:
    """The Node object for the ``index``-th node: rack and block follow from the index."""
    rack = index // shape.nodes_per_rack
    # The beta twins of the os/arch labels are there from the start, as a kubelet registers
    # them: otherwise kube-controller-manager's node lifecycle controller adds them some time
    # after the node is made, and a test that snapshots a node's labels races it.
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "type": "kwok",
        RACK_LABEL: f"rack-{rack}",
        BLOCK_LABEL: f"block-{rack // shape.racks_per_block}",
    }
    if shape.enable:
        labels[FEATURE_LABEL] = "true"
    labels.update(shape.labels)
    spec: dict[str, Any] = {}
    if shape.taint:
        spec["taints"] = [{"key": KWOK_TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]
    capacity = shape.capacity()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
        },
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def create_nodes(
    api: client.ApiClient,
    names: list[str],
    shape: NodeShape,
    *,
    first_index: int = 0,
    parallelism: int = 8,
) -> None:
    """Create the nodes concurrently; responses are not decoded (that is most of the cost)."""
    core = client.CoreV1Api(api)

    def create(item: tuple[int, str]) -> None:
        index, name = item
        body: Any = node_manifest(name, first_index + index, shape)
        for attempt in range(_ATTEMPTS):
            try:
                resp: Any = core.create_node(body, _preload_content=False)
                # Read the body before the connection goes back to the pool: a reused
                # connection with unread bytes answers the next request with garbage.
                resp.drain_conn()
                resp.release_conn()
                return
            except ApiException as e:
                if e.status == 409:
                    return
                if e.status not in (429, 500, 503, 504) or attempt == _ATTEMPTS - 1:
                    raise
            except urllib3.exceptions.HTTPError:
                if attempt == _ATTEMPTS - 1:
                    raise
            time.sleep(0.2 * 2**attempt)

    with ThreadPoolExecutor(max_workers=parallelism) as pool:
        list(pool.map(create, enumerate(names)))


_NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def _schedulable(node: client.V1Node) -> bool:
    """Ready=True, and the not-ready taint gone: the apiserver taints every new node
    ``node.kubernetes.io/not-ready:NoSchedule`` and the node-lifecycle controller lifts it only
    some time after KWOK reports Ready, so a Ready node can still refuse pods for a while."""
    conds = (node.status.conditions or []) if node.status else []
    taints = (node.spec.taints or []) if node.spec else []
    return any(c.type == "Ready" and c.status == "True" for c in conds) and not any(
        t.key in _NOT_READY_TAINTS for t in taints
    )


def wait_nodes_ready(api: client.ApiClient, names: list[str], deadline_s: float = 120.0) -> None:
    """Return when every named node is Ready=True (KWOK's node-initialize stage ran) and no
    longer carries the not-ready taint, so a scheduler may place pods on it."""
    core = client.CoreV1Api(api)
    wanted = set(names)
    deadline = time.monotonic() + deadline_s
    interval = 0.1
    while True:
        ready = {
            str(n.metadata.name if n.metadata else "")
            for n in core.list_node(label_selector="type=kwok").items
            if _schedulable(n)
        }
        missing = wanted - ready
        if not missing:
            return
        if time.monotonic() > deadline:
            sample = sorted(missing)[:5]
            raise TimeoutError(
                f"{len(missing)} of {len(wanted)} KWOK nodes not Ready and untainted within "
                f"{deadline_s:.0f} s "
                f"(e.g. {sample}): check the kwok and kube-controller-manager logs"
            )
        time.sleep(interval)
        interval = min(interval * 1.5, 1.0)
