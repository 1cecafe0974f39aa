"""Inter-pod affinity and topology spread on a real apiserver with KWOK GPU nodes, each case
under kube-scheduler and under ours on the same nodes (issue 35): the same pods bound, kept
apart or together the same way, and FailedScheduling in kube-scheduler's words."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

HOST = "kubernetes.io/hostname"
SHARE = {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "10"}
WHO = {"k": "default-scheduler", "lj": "lj-runtimekit-scheduler"}


def anti(app: str, key: str = HOST) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


async def test_anti_affinity_replicas_with_gpu_shares_land_apart_like_kube_scheduler(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    # the 2-replica deployment with required anti-affinity and gpu-core/gpu-memory,
    # plus a third replica that no node can take
    gpu_cluster.gpu_nodes(2)
    scheduler()
    names: dict[str, list[str]] = {}
    for tag, who in WHO.items():
        app = f"web-{tag}"
        names[tag] = [
            gpu_cluster.pod(
                f"{app}-{i}", SHARE, scheduler=who, labels={"app": app}, affinity=anti(app)
            )
            for i in range(3)
        ]
    for tag in WHO:
        await gpu_cluster.wait_decided(names[tag])
        placed = {n: gpu_cluster.node_of(n) for n in names[tag]}
        bound = [node for node in placed.values() if node]
        assert len(bound) == 2, (tag, placed)
        assert len(set(bound)) == 2, f"{tag}: the replicas share a node: {placed}"
    refused = [n for n in names["lj"] if gpu_cluster.node_of(n) is None]
    assert any(
        "node(s) didn't match pod anti-affinity rules" in e for e in gpu_cluster.events(refused[0])
    ), gpu_cluster.events(refused[0])


async def test_existing_anti_affinity_repels_and_spread_balances_like_kube_scheduler(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    nodes = gpu_cluster.gpu_nodes(2)
    scheduler()
    # a guard pod on the first node repels pods labelled role=noisy from it (symmetric check)
    guard = gpu_cluster.pod(
        "guard",
        {"cpu": "10m"},
        scheduler="default-scheduler",
        affinity=anti("noisy"),
        nodeName=nodes[0],
    )
    await gpu_cluster.wait_bound([guard])
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": HOST,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "spread-x"}},
        }
    ]
    placed: dict[str, list[str | None]] = {}
    for tag, who in WHO.items():
        noisy = [
            gpu_cluster.pod(f"noisy-{tag}-{i}", SHARE, scheduler=who, labels={"app": "noisy"})
            for i in range(2)
        ]
        await gpu_cluster.wait_bound(noisy)
        placed[f"noisy-{tag}"] = [gpu_cluster.node_of(n) for n in noisy]
        for n in noisy:  # out of the way of the other scheduler's turn
            gpu_cluster.core.delete_namespaced_pod(n, gpu_cluster.namespace, grace_period_seconds=0)
        app = f"spread-{tag}"
        rules = [{**spread[0], "labelSelector": {"matchLabels": {"app": app}}}]
        pods = [
            gpu_cluster.pod(
                f"{app}-{i}",
                SHARE,
                scheduler=who,
                labels={"app": app},
                topologySpreadConstraints=rules,
            )
            for i in range(4)
        ]
        await gpu_cluster.wait_bound(pods)
        placed[app] = [gpu_cluster.node_of(n) for n in pods]
    for tag in WHO:
        assert set(placed[f"noisy-{tag}"]) == {nodes[1]}, (tag, placed)
        assert sorted(Counter(placed[f"spread-{tag}"]).values()) == [2, 2], (tag, placed)


async def test_namespace_selector_follows_the_namespace_s_labels_like_kube_scheduler(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    nodes = gpu_cluster.gpu_nodes(2)
    ns = gpu_cluster.namespace
    gpu_cluster.core.patch_namespace(ns, {"metadata": {"labels": {"team": gpu_cluster.tag}}})
    target = gpu_cluster.pod(
        "target",
        {"cpu": "10m"},
        scheduler="default-scheduler",
        labels={"app": "db"},
        nodeName=nodes[1],
    )
    await gpu_cluster.wait_bound([target])
    scheduler()
    term = {
        "labelSelector": {"matchLabels": {"app": "db"}},
        "namespaceSelector": {"matchLabels": {"team": gpu_cluster.tag}},
        "topologyKey": HOST,
    }
    together = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    other = {**term, "namespaceSelector": {"matchLabels": {"team": "nobody"}}}
    nowhere = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [other]}}
    names = []
    for tag, who in WHO.items():
        names.append(gpu_cluster.pod(f"with-{tag}", SHARE, scheduler=who, affinity=together))
        names.append(gpu_cluster.pod(f"none-{tag}", SHARE, scheduler=who, affinity=nowhere))
    await gpu_cluster.wait_decided(names)
    for tag in WHO:
        assert gpu_cluster.node_of(f"with-{tag}") == nodes[1], tag
        assert gpu_cluster.node_of(f"none-{tag}") is None, tag
    assert any(
        "node(s) didn't match pod affinity rules" in e for e in gpu_cluster.events("none-lj")
    ), gpu_cluster.events("none-lj")
