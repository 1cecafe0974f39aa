"""Upstream PodGroups (``scheduling.k8s.io/v1beta1``) on the real apiserver with KWOK nodes:
a gang of GPU pods placed whole in one block with its GPUs chosen, one that cannot fit whole
left entirely pending with the reason, a basic group placed one by one; the PodGroup's
``PodGroupInitiallyScheduled`` condition written as kube-scheduler writes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "scheduling.k8s.io", "v1beta1", "podgroups"
GPU = "aliyun.com/gpu"


def pod_group(gpu_cluster: Any, name: str, min_count: int = 0) -> None:
    policy = {"gang": {"minCount": min_count}} if min_count else {"basic": {}}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": policy},
    }
    gpu_cluster.custom.create_namespaced_custom_object(
        GROUP, VERSION, gpu_cluster.namespace, PLURAL, body
    )


def condition(gpu_cluster: Any, name: str) -> dict[str, Any] | None:
    """The PodGroup's PodGroupInitiallyScheduled condition, or None."""
    obj = gpu_cluster.custom.get_namespaced_custom_object(
        GROUP, VERSION, gpu_cluster.namespace, PLURAL, name
    )
    found = [
        c
        for c in (obj.get("status") or {}).get("conditions") or ()
        if c.get("type") == "PodGroupInitiallyScheduled"
    ]
    return found[0] if found else None


def member(gpu_cluster: Any, name: str, group: str, gpus: int) -> str:
    return str(gpu_cluster.pod(name, {GPU: str(gpus)}, schedulingGroup={"podGroupName": group}))


async def test_a_pod_group_gang_of_gpu_pods_lands_whole_in_one_block(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    small = gpu_cluster.gpu_nodes(1, gpus=8, labels={"network.topology/block": "small"})
    big = gpu_cluster.gpu_nodes(2, gpus=8, labels={"network.topology/block": "big"})
    scheduler()
    # the pods come first: they wait for their PodGroup, holding nothing
    names = [member(gpu_cluster, f"train-{i}", "train", 4) for i in range(4)]
    await gpu_cluster.wait_refused(names, "waiting for PodGroup")
    assert not any(gpu_cluster.nodes_of(names).values())
    pod_group(gpu_cluster, "train", min_count=4)
    bound = await gpu_cluster.wait_bound(names)
    # 4 × 4 GPUs = two nodes' worth: only block "big" holds it whole
    assert set(bound.values()) == set(big)
    assert not set(bound.values()) & set(small)
    for node in big:  # the GPUs chosen: two pods per node on disjoint GPUs
        ids = [
            d["id"]
            for n in names
            if bound[n] == node
            for d in gpu_cluster.assignment(n)["containers"][0]["devices"]
        ]
        assert len(ids) == len(set(ids)) == 8
    got = await gpu_cluster.until(
        "PodGroupInitiallyScheduled True", lambda: condition(gpu_cluster, "train")
    )
    assert (got["status"], got["reason"]) == ("True", "Scheduled")


async def test_a_pod_group_gang_that_cannot_fit_whole_stays_entirely_pending(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(2, gpus=8)
    scheduler()
    pod_group(gpu_cluster, "big", min_count=3)
    # 3 × 8 GPUs on two 8-GPU nodes: two would fit, the gang does not
    names = [member(gpu_cluster, f"big-{i}", "big", 8) for i in range(3)]
    await gpu_cluster.wait_refused(names, "minCount (3) cannot be satisfied")
    assert not any(gpu_cluster.nodes_of(names).values())
    for n in names:
        assert gpu_cluster.refused(n, "minCount (3) cannot be satisfied"), gpu_cluster.events(n)
    got = await gpu_cluster.until(
        "PodGroupInitiallyScheduled False", lambda: condition(gpu_cluster, "big")
    )
    assert (got["status"], got["reason"]) == ("False", "Unschedulable")
    assert "minCount (3) cannot be satisfied" in got["message"]


async def test_a_basic_pod_group_is_placed_one_by_one(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(2, gpus=8)
    scheduler()
    pod_group(gpu_cluster, "svc")
    names = [member(gpu_cluster, f"svc-{i}", "svc", 8) for i in range(3)]
    await gpu_cluster.wait_decided(names)
    placed = [n for n, node in gpu_cluster.nodes_of(names).items() if node]
    assert len(placed) == 2  # as many as fit: no all-or-nothing
