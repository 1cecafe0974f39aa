"""Our scheduler on a node in DRA mode (real apiserver, kube-scheduler and garbage collector; a
KWOK node): pods asking ``gpu-core``/``gpu-memory`` or ``aliyun.com/gpu`` get a ResourceClaim of
exactly their devices, allocated beside the claims kube-scheduler allocates there, and the
pod's ``extendedResourceClaimStatus`` (docs/dra.md, "Our scheduler on DRA nodes").

KWOK runs no kubelet: nothing is prepared here (tests/guide_tests/test_dra_on_real_nodes.py runs
such a pod on a real node)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from lj_runtimekit_testkit.bench import dra

pytestmark = pytest.mark.cluster

CLAIMS = (dra.GROUP, dra.VERSION)
EXTENDED = "resource.kubernetes.io/extended-resource-claim"
SHARE = {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "10"}


@pytest.fixture
def dra_node(cluster: Any, gpu_cluster: Any) -> Iterator[str]:
    """A node in DRA mode: two GPUs in its NodeDevices and its shareable ResourceSlice, none
    advertised as extended resources; the suite's DeviceClasses exist."""
    (node,) = gpu_cluster.gpu_nodes(1, gpus=2, advertised=False)
    name = dra.gpu_slice(node)["metadata"]["name"]
    with dra.suite_device_classes(cluster.api_client):
        with cluster.api_client() as api:
            dra.create(api, dra.gpu_slice(node, 2, shareable=True))
        try:
            yield node
        finally:
            with cluster.api_client() as api:
                client.CustomObjectsApi(api).delete_cluster_custom_object(
                    *CLAIMS, "resourceslices", name
                )


def claims(gpu_cluster: Any) -> dict[str, dict[str, Any]]:
    """The namespace's claims by owner pod name (template claims by their pod too)."""
    items = gpu_cluster.custom.list_namespaced_custom_object(
        *CLAIMS, gpu_cluster.namespace, "resourceclaims"
    )["items"]
    return {c["metadata"]["ownerReferences"][0]["name"]: c for c in items}


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return out


def kube_scheduler_pod(gpu_cluster: Any, name: str) -> None:
    """A pod of kube-scheduler's with a claim for one whole GPU of the suite's class."""
    with gpu_cluster.cluster.api_client() as api:
        dra.create(api, dra.claim_template(name, dra.claim_spec()), gpu_cluster.namespace)
    gpu_cluster.pod(
        name,
        scheduler="default-scheduler",
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": name}],
    )


async def test_our_pods_get_claims_beside_kube_schedulers_and_free_them_with_the_pod(
    gpu_cluster: Any, scheduler: Callable[..., Any], dra_node: str
) -> None:
    kube_scheduler_pod(gpu_cluster, "theirs")
    await gpu_cluster.wait_bound(["theirs"])
    (taken,) = results(
        await gpu_cluster.until("their claim", lambda: claims(gpu_cluster).get("theirs"))
    )
    other = "gpu-1" if taken["device"] == "gpu-0" else "gpu-0"

    scheduler()
    shares = [gpu_cluster.pod(f"share-{i}", SHARE) for i in range(2)]
    bound = await gpu_cluster.wait_bound(shares)
    assert set(bound.values()) == {dra_node}
    ours = await gpu_cluster.until(
        "both share claims",
        lambda: (c := claims(gpu_cluster)) and all(s in c for s in shares) and c,
    )
    for name in shares:
        claim = ours[name]
        assert claim["metadata"]["annotations"][EXTENDED] == "true"
        (result,) = results(claim)
        # beside kube-scheduler's claim, never on its GPU; both shares on one GPU (binpack)
        assert (result["pool"], result["device"]) == (dra_node, other)
        assert result["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}
        assert result["shareID"]
        pod = gpu_cluster.core.read_namespaced_pod(name, gpu_cluster.namespace)
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod.metadata.uid]
        mapping = pod.status.extended_resource_claim_status
        assert mapping.resource_claim_name == claim["metadata"]["name"]
        assert {
            (m.container_name, m.resource_name, m.request_name) for m in mapping.request_mappings
        } == {
            ("main", "aliyun.com/gpu-core", result["request"]),
            ("main", "aliyun.com/gpu-memory", result["request"]),
        }
        assert gpu_cluster.assignment(name)["containers"][0]["devices"][0]["id"] == other

    # the node's GPUs: one whole to kube-scheduler's pod, 60 % of the other to ours
    whole = gpu_cluster.pod("whole", {"aliyun.com/gpu": "1"})
    await gpu_cluster.wait_refused([whole])
    assert gpu_cluster.node_of(whole) is None
    for name in shares:
        gpu_cluster.core.delete_namespaced_pod(name, gpu_cluster.namespace, grace_period_seconds=0)
    # the garbage collector takes the pods' claims; the freed GPU goes to the waiting pod
    await gpu_cluster.until(
        "the share claims gone", lambda: not set(shares) & set(claims(gpu_cluster)), 90
    )
    assert (await gpu_cluster.wait_bound([whole], 90))[whole] == dra_node
    claim = await gpu_cluster.until("the whole GPU's claim", lambda: claims(gpu_cluster).get(whole))
    (result,) = results(claim)
    assert result["device"] == other
    assert result["consumedCapacity"] == {"cores": "100", "memory": "80Gi"}
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == dra.GPU_CLASS


async def test_a_gang_of_shares_is_placed_whole_on_a_dra_node(
    gpu_cluster: Any, scheduler: Callable[..., Any], dra_node: str
) -> None:
    scheduler()
    group = {
        "lj-runtimekit-scheduler/pod-group": "shares",
        "lj-runtimekit-scheduler/pod-group-size": "3",
    }
    first = [gpu_cluster.pod(f"g-{i}", SHARE, annotations=group) for i in range(2)]
    await gpu_cluster.wait_refused(first, "waiting for 1 more of 3")
    assert not any(gpu_cluster.nodes_of(first).values())  # waits for its third member
    last = gpu_cluster.pod("g-2", SHARE, annotations=group)
    bound = await gpu_cluster.wait_bound([*first, last])
    assert set(bound.values()) == {dra_node}
    held = await gpu_cluster.until(
        "three claims", lambda: len(claims(gpu_cluster)) == 3 and claims(gpu_cluster)
    )
    assert sum(int(results(c)[0]["consumedCapacity"]["cores"]) for c in held.values()) == 90


async def test_a_share_naming_only_memory_is_refused_on_a_dra_node(
    gpu_cluster: Any, scheduler: Callable[..., Any], dra_node: str
) -> None:
    scheduler()
    pod = gpu_cluster.pod("memory-only", {"aliyun.com/gpu-memory": "10"})
    events = await gpu_cluster.until(
        "FailedScheduling", lambda: [e for e in gpu_cluster.events(pod) if "FailedScheduling" in e]
    )
    assert "on a DRA node a share names both" in events[0], events
    assert gpu_cluster.node_of(pod) is None
