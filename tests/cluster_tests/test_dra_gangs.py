"""Gangs of DRA pods (issue 24): kube-scheduler places pods with ResourceClaims all or nothing when
they belong to a PodGroup of the upstream Workload API (``scheduling.k8s.io/v1beta1``, beta in
1.37, the GenericWorkload feature gate and runtime-config the test control plane turns on).

KWOK nodes publish one ResourceSlice of GPUs each, in the shape of the driver's DRA mode, and the
suite's DeviceClasses are applied as deployed. Every pod asks one GPU of
``gpu.lj-runtimekit.aliyun.com`` through a ResourceClaimTemplate; its group is a PodGroup made
from a Workload's template with ``gang.minCount`` = the gang's size. KWOK runs no kubelet, so
nothing is prepared: the test is about placement and allocation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.bench import dra
from lj_runtimekit_testkit.cluster.handle import Cluster

pytestmark = pytest.mark.cluster

SIZE = 4
TEMPLATE = "one-gpu"
POOL_LABEL = "lj-runtimekit-test/gang-pool"
SCHEDULING = ("scheduling.k8s.io", "v1beta1")
GROUP_TEMPLATE = "workers"
SCHEDULED = "PodGroupInitiallyScheduled"
SLICES = (dra.GROUP, dra.VERSION, "resourceslices")


def _eventually(what: str, check: Callable[[], bool], deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    interval = 0.1
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s:.0f} s")
        time.sleep(interval)
        interval = min(interval * 1.5, 1.0)


class GpuPool:
    """KWOK nodes of one test, each with a ResourceSlice of GPUs, all labelled with the test's
    pool so that its pods land on no other test's nodes."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.name = f"gang-{uuid.uuid4().hex[:8]}"
        self.nodes: list[str] = []

    def add(self, gpus: int) -> str:
        """One more node (advertising no GPU resource) with a slice of ``gpus`` GPUs."""
        (node,) = self.cluster.create_gpu_nodes(
            1, prefix=self.name, gpus=0, labels={POOL_LABEL: self.name}
        )
        self.nodes.append(node)
        with self.cluster.api_client() as api:
            dra.create(api, dra.gpu_slice(node, gpus))
        return node

    def remove(self) -> None:
        with self.cluster.api_client() as api:
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            for node in self.nodes:
                name = dra.gpu_slice(node)["metadata"]["name"]
                _absent(custom.delete_cluster_custom_object, *SLICES, name)
                _absent(core.delete_node, node)


def _absent(delete: Callable[..., object], *args: str) -> None:
    try:
        delete(*args)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def pool(cluster: Cluster, namespace: str) -> Iterator[GpuPool]:
    """The test's GPU nodes (none yet); the suite's DeviceClasses and the namespace's claim
    template exist. The classes this fixture made are deleted afterwards, so that the session's
    other tests meet no extended-resource mapping (``aliyun.com/gpu`` served by DRA)."""
    gpus = GpuPool(cluster)
    with dra.suite_device_classes(cluster.api_client):
        try:
            with cluster.api_client() as api:
                dra.create(api, dra.claim_template(TEMPLATE, dra.claim_spec()), namespace)
            yield gpus
        finally:
            gpus.remove()


def workload(name: str, min_count: int) -> dict[str, Any]:
    """What an operator (or a Job/JobSet controller) writes once per workload."""
    policy = {"gang": {"minCount": min_count}}
    return {
        "apiVersion": "/".join(SCHEDULING),
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"podGroupTemplates": [{"name": GROUP_TEMPLATE, "schedulingPolicy": policy}]},
    }


def pod_group(name: str, workload_name: str, min_count: int) -> dict[str, Any]:
    """The runtime instance of the Workload's template that the pods name."""
    return {
        "apiVersion": "/".join(SCHEDULING),
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "workloadRef": {"workloadName": workload_name, "templateName": GROUP_TEMPLATE},
            "schedulingPolicy": {"gang": {"minCount": min_count}},
        },
    }


def gang_pod(name: str, pool: GpuPool, group: str | None) -> dict[str, Any]:
    """A pod for kube-scheduler on ``pool``'s nodes with a claim for one GPU from the template;
    in PodGroup ``group`` unless None."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {POOL_LABEL: pool.name},
        "containers": [{"name": "main", "image": "busybox", "resources": {}}],
    }
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    return dra.use_claim(body, {"resourceClaimTemplateName": TEMPLATE})


def create_gang(cluster: Cluster, namespace: str, pool: GpuPool, *, grouped: bool = True) -> None:
    """The Workload, its PodGroup (minCount :data:`SIZE`) and :data:`SIZE` pods naming it; with
    ``grouped=False`` only the same pods, in no group."""
    with cluster.api_client() as api:
        custom: Any = client.CustomObjectsApi(api)
        group = None
        if grouped:
            group = "trainer-0"
            for body, plural in (
                (workload("trainer", SIZE), "workloads"),
                (pod_group(group, "trainer", SIZE), "podgroups"),
            ):
                custom.create_namespaced_custom_object(*SCHEDULING, namespace, plural, body)
        core: Any = client.CoreV1Api(api)
        for i in range(SIZE):
            core.create_namespaced_pod(namespace, gang_pod(f"worker-{i}", pool, group))


def placed(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Pod name → node, for the bound pods."""
    with cluster.api_client() as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
    return {
        str(p.metadata.name): str(p.spec.node_name)
        for p in pods
        if p.metadata and p.spec and p.spec.node_name
    }


def claims(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    with cluster.api_client() as api:
        got: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
            dra.GROUP, dra.VERSION, namespace, "resourceclaims"
        )
    items: list[dict[str, Any]] = got["items"]
    return items


def allocated(claim: dict[str, Any]) -> list[tuple[str, str]]:
    """The (pool, device) pairs allocated to ``claim``; empty while it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [(r["pool"], r["device"]) for r in allocation.get("devices", {}).get("results", [])]


def owner(claim: dict[str, Any]) -> str:
    (ref,) = [r for r in claim["metadata"].get("ownerReferences", []) if r["kind"] == "Pod"]
    return str(ref["name"])


def unschedulable(cluster: Cluster, namespace: str) -> set[str]:
    """The pods that kube-scheduler has tried and found unschedulable."""
    with cluster.api_client() as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
    return {
        str(p.metadata.name)
        for p in pods
        if p.metadata
        and any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in (p.status.conditions if p.status else None) or []
        )
    }


def group_condition(cluster: Cluster, namespace: str) -> tuple[str, str] | None:
    """The PodGroup's PodGroupInitiallyScheduled condition as (status, reason), if any."""
    with cluster.api_client() as api:
        got: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            *SCHEDULING, namespace, "podgroups", "trainer-0"
        )
    for c in (got.get("status") or {}).get("conditions") or []:
        if c["type"] == SCHEDULED:
            return str(c["status"]), str(c.get("reason", ""))
    return None


def assert_whole_gang_allocated(cluster: Cluster, namespace: str) -> None:
    """Every pod bound, and each one's claim allocated one GPU of its own node, no GPU twice."""
    where = placed(cluster, namespace)
    assert sorted(where) == [f"worker-{i}" for i in range(SIZE)]
    by_pod = {owner(c): allocated(c) for c in claims(cluster, namespace)}
    assert sorted(by_pod) == sorted(where)
    devices = [d for pairs in by_pod.values() for d in pairs]
    assert len(devices) == SIZE == len(set(devices)), by_pod
    for pod, pairs in by_pod.items():
        assert [p for p, _ in pairs] == [where[pod]], (pod, pairs, where[pod])


def test_a_gang_with_room_for_all_is_bound_whole_with_distinct_gpus(
    cluster: Cluster, namespace: str, pool: GpuPool
) -> None:
    pool.add(gpus=2)
    pool.add(gpus=2)
    create_gang(cluster, namespace, pool)
    _eventually(f"all {SIZE} pods bound", lambda: len(placed(cluster, namespace)) == SIZE)
    assert_whole_gang_allocated(cluster, namespace)
    assert set(placed(cluster, namespace).values()) == set(pool.nodes)
    _eventually(
        "PodGroupInitiallyScheduled=True",
        lambda: (group_condition(cluster, namespace) or ("", ""))[0] == "True",
    )


def test_a_gang_without_room_for_all_binds_none_until_room_appears(
    cluster: Cluster, namespace: str, pool: GpuPool
) -> None:
    pool.add(gpus=SIZE - 1)
    create_gang(cluster, namespace, pool)
    _eventually(
        "every pod's claim made",
        lambda: len(claims(cluster, namespace)) == SIZE,
    )
    _eventually(
        f"kube-scheduler deciding on all {SIZE} pods",
        lambda: len(unschedulable(cluster, namespace)) + len(placed(cluster, namespace)) == SIZE,
    )
    assert placed(cluster, namespace) == {}
    assert group_condition(cluster, namespace) == ("False", "Unschedulable")
    assert [allocated(c) for c in claims(cluster, namespace)] == [[]] * SIZE

    pool.add(gpus=1)
    _eventually(
        f"all {SIZE} pods bound once a GPU more appears",
        lambda: len(placed(cluster, namespace)) == SIZE,
    )
    assert_whole_gang_allocated(cluster, namespace)


def test_the_same_pods_in_no_group_bind_one_by_one(
    cluster: Cluster, namespace: str, pool: GpuPool
) -> None:
    """The control for the test above: on the same room the pods without a PodGroup are placed
    one by one, so it is the gang that holds them back."""
    pool.add(gpus=SIZE - 1)
    create_gang(cluster, namespace, pool, grouped=False)
    _eventually(
        f"{SIZE - 1} pods bound, one unschedulable",
        lambda: (
            len(placed(cluster, namespace)) == SIZE - 1
            and len(unschedulable(cluster, namespace)) == 1
        ),
    )
    assert sum(1 for c in claims(cluster, namespace) if allocated(c)) == SIZE - 1
