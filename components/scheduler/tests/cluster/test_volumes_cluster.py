"""Pods with claims on the real apiserver, with kube-controller-manager's PV controller binding
them: a WaitForFirstConsumer local PV pulls a GPU-share pod to its node and the claim ends
Bound; a pod whose Immediate claim is unbound waits, and is placed once the PV controller has
bound the claim."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.cluster


class Storage:
    """Cluster-scoped storage objects of one test (deleted after it)."""

    def __init__(self, gpu_cluster: Any) -> None:
        self.core: Any = gpu_cluster.core
        self.storage: Any = client.StorageV1Api(gpu_cluster.api)
        self.namespace = gpu_cluster.namespace
        self.tag = uuid.uuid4().hex[:6]
        self.classes: list[str] = []
        self.volumes: list[str] = []

    def storage_class(self, mode: str) -> str:
        name = f"local-{mode.lower()}-{self.tag}"
        self.storage.create_storage_class(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": name},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": mode,
            }
        )
        self.classes.append(name)
        return name

    def local_pv(self, node: str, storage_class: str, size: str = "10Gi") -> str:
        name = f"pv-{self.tag}-{len(self.volumes)}"
        self.core.create_persistent_volume(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": storage_class,
                    "local": {"path": "/mnt/disks/ssd0"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )
        self.volumes.append(name)
        return name

    def claim(self, name: str, storage_class: str, size: str = "5Gi") -> str:
        self.core.create_namespaced_persistent_volume_claim(
            self.namespace,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": size}},
                },
            },
        )
        return name

    def read_claim(self, name: str) -> Any:
        return self.core.read_namespaced_persistent_volume_claim(name, self.namespace)

    def pv_phase(self, name: str) -> str:
        return str(self.core.read_persistent_volume(name).status.phase)

    def clean(self) -> None:
        for name in self.volumes:
            self._gone(self.core.delete_persistent_volume, name)
        for name in self.classes:
            self._gone(self.storage.delete_storage_class, name)

    @staticmethod
    def _gone(delete: Callable[[str], Any], name: str) -> None:
        try:
            delete(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture
def volumes(gpu_cluster: Any) -> Iterator[Storage]:
    s = Storage(gpu_cluster)
    try:
        yield s
    finally:
        s.clean()


def uses(claim: str) -> dict[str, Any]:
    return {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}


SHARE = {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "20"}


async def test_a_wait_for_first_consumer_local_pv_takes_a_gpu_share_pod_to_its_node(
    gpu_cluster: Any, scheduler: Callable[..., Any], volumes: Storage
) -> None:
    nodes = gpu_cluster.gpu_nodes(3)
    target = nodes[1]
    cls = volumes.storage_class("WaitForFirstConsumer")
    pv = volumes.local_pv(target, cls)
    claim = volumes.claim("dataset", cls)
    # the PV controller makes the new PV Available and leaves the claim to its first consumer
    await gpu_cluster.until(f"{pv} Available", lambda: volumes.pv_phase(pv) == "Available")
    scheduler()
    name = gpu_cluster.pod("trainer", SHARE, **uses(claim))
    bound = await gpu_cluster.wait_bound([name], deadline_s=90)
    assert bound == {name: target}
    decision = gpu_cluster.assignment(name)
    assert decision["node"] == target
    assert decision["containers"][0]["devices"][0]["core"] == 50

    def claim_bound() -> bool:
        c = volumes.read_claim(claim)
        return bool(c.status.phase == "Bound" and c.spec.volume_name == pv)

    await gpu_cluster.until(f"claim {claim} Bound to {pv}", claim_bound)
    annotations = volumes.read_claim(claim).metadata.annotations or {}
    assert annotations.get("pv.kubernetes.io/bind-completed") == "yes"


async def test_an_unbound_immediate_claim_holds_its_pod_until_the_pv_controller_binds_it(
    gpu_cluster: Any, scheduler: Callable[..., Any], volumes: Storage
) -> None:
    nodes = gpu_cluster.gpu_nodes(2)
    cls = volumes.storage_class("Immediate")
    claim = volumes.claim("checkpoint", cls)
    scheduler()
    name = gpu_cluster.pod("restore", SHARE, **uses(claim))
    await gpu_cluster.wait_refused([name], "pod has unbound immediate PersistentVolumeClaims")
    assert gpu_cluster.node_of(name) is None
    # the PV controller binds the claim to a PV it can match; the claim's update requeues the pod
    pv = volumes.local_pv(nodes[0], cls)
    bound = await gpu_cluster.wait_bound([name], deadline_s=120)
    assert bound == {name: nodes[0]}
    assert volumes.read_claim(claim).spec.volume_name == pv
