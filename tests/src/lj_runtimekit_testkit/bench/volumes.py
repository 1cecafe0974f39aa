"""PersistentVolumes and claims for the scheduler benchmarks on KWOK nodes.

KWOK pods mount nothing, so what is measured is the scheduler's side: VolumeBinding's filter
and, for a ``WaitForFirstConsumer`` claim, PreBind writing the PV's claimRef and waiting for
kube-controller-manager's PV controller to bind the claim. Two kinds, the on-prem cases:

- a claim bound before the phase (the pair made pre-bound, both ways, and the PV controller
  waited for) to a PV reachable from one rack (node affinity on the rack label): the pod goes
  where its data is;
- a ``WaitForFirstConsumer`` claim of the class :data:`LOCAL_CLASS` with one static local PV
  per claim, each reachable from one node (hostname affinity): the scheduler picks the PV.

PVs are cluster-scoped: each is named after its phase's namespace and labelled with it, so a
phase's cleanup deletes its own (with ``Retain`` a released PV would never bind again).
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

LOCAL_CLASS = "bench-local"
"""``WaitForFirstConsumer``, no provisioner: static local PVs only."""
BOUND_CLASS = "bench-bound"
"""``Immediate``, no provisioner: the pre-bound pairs."""
NS_LABEL = "bench-namespace"
RACK = "network.topology/rack"
HOSTNAME = "kubernetes.io/hostname"


def storage_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": mode,
            "reclaimPolicy": "Retain",
        }
        for name, mode in ((LOCAL_CLASS, "WaitForFirstConsumer"), (BOUND_CLASS, "Immediate"))
    ]


def install_classes(api: client.ApiClient) -> None:
    storage: Any = client.StorageV1Api(api)
    for body in storage_classes():
        try:
            storage.create_storage_class(body)
        except ApiException as e:
            if e.status != 409:
                raise


def volume(
    name: str, ns: str, cls: str, where: tuple[str, str], claim: str | None = None
) -> dict[str, Any]:
    """A 10Gi local PV reachable where the node label ``where[0]`` is ``where[1]``; ``claim``:
    pre-bound to that claim of ``ns``."""
    key, value = where
    spec: dict[str, Any] = {
        "capacity": {"storage": "10Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": cls,
        "local": {"path": f"/mnt/bench/{name}"},
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                ]
            }
        },
    }
    if claim is not None:
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": ns, "name": claim}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {NS_LABEL: ns}},
        "spec": spec,
    }


def claim(name: str, cls: str, volume_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": cls,
        "resources": {"requests": {"storage": "10Gi"}},
    }
    if volume_name is not None:
        spec["volumeName"] = volume_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def use_claim(pod: dict[str, Any], claim_name: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return pod


def make_bound(
    api: client.ApiClient, ns: str, pairs: list[tuple[str, str]], deadline_s: float = 300
) -> None:
    """For each (claim name, rack): a PV of that rack pre-bound to the claim, and the claim; then
    waits until the PV controller has bound every claim (not timed: the pods come after)."""
    core: Any = client.CoreV1Api(api)
    for name, rack in pairs:
        core.create_persistent_volume(volume(f"{ns}-{name}", ns, BOUND_CLASS, (RACK, rack), name))
        core.create_namespaced_persistent_volume_claim(ns, claim(name, BOUND_CLASS, f"{ns}-{name}"))
    end = time.monotonic() + deadline_s
    while True:
        claims = core.list_namespaced_persistent_volume_claim(ns).items
        unbound = [c.metadata.name for c in claims if c.status.phase != "Bound"]
        if not unbound:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"PV controller bound no {unbound[:5]} within {deadline_s:g} s")
        time.sleep(0.5)


def make_local(api: client.ApiClient, ns: str, pairs: list[tuple[str, str]]) -> None:
    """For each (claim name, node): an unbound claim of :data:`LOCAL_CLASS` and a free local PV
    on that node (any claim of the class may take it: the scheduler chooses)."""
    core: Any = client.CoreV1Api(api)
    for name, node in pairs:
        core.create_persistent_volume(volume(f"{ns}-{name}", ns, LOCAL_CLASS, (HOSTNAME, node)))
        core.create_namespaced_persistent_volume_claim(ns, claim(name, LOCAL_CLASS))


def delete_volumes(api: client.ApiClient, ns: str) -> None:
    """The phase's claims and PVs (its pods are gone: the protection finalizers let go)."""
    core: Any = client.CoreV1Api(api)
    core.delete_collection_namespaced_persistent_volume_claim(ns)
    core.delete_collection_persistent_volume(label_selector=f"{NS_LABEL}={ns}")
