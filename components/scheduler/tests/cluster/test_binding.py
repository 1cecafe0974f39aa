"""Our scheduler on the real apiserver with KWOK nodes: bindings, GPU decisions, gangs,
and the same verdicts as kube-scheduler on identical pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.cluster


async def test_gpu_pods_are_bound_with_their_decision_written(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    (node,) = gpu_cluster.gpu_nodes(1)
    scheduler()
    whole = gpu_cluster.pod("whole", {"aliyun.com/gpu": "4"})
    shared = [
        gpu_cluster.pod(f"shared-{i}", {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "20"})
        for i in range(2)
    ]
    bound = await gpu_cluster.wait_bound([whole, *shared])
    assert set(bound.values()) == {node}
    w = gpu_cluster.assignment(whole)
    ids = [d["id"] for d in w["containers"][0]["devices"]]
    assert w["node"] == node
    assert len(ids) == 4
    assert ids in (["gpu-0", "gpu-1", "gpu-2", "gpu-3"], ["gpu-4", "gpu-5", "gpu-6", "gpu-7"])
    slices = [gpu_cluster.assignment(p)["containers"][0]["devices"][0] for p in shared]
    assert {s["id"] for s in slices}.isdisjoint(ids)
    # binpack: both halves on one GPU
    assert slices[0]["id"] == slices[1]["id"]
    assert sum(s["core"] for s in slices) == 100


async def test_gang_waits_whole_then_lands_in_one_block(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(2, gpus=8)
    scheduler()
    group = {
        "lj-runtimekit-scheduler/pod-group": "g",
        "lj-runtimekit-scheduler/pod-group-size": "4",
    }
    first = [
        gpu_cluster.pod(f"g-{i}", {"aliyun.com/gpu": "4"}, annotations=group) for i in range(3)
    ]
    await gpu_cluster.wait_refused(first, "waiting for 1 more of 4")
    assert not any(gpu_cluster.nodes_of(first).values())
    last = gpu_cluster.pod("g-3", {"aliyun.com/gpu": "4"}, annotations=group)
    bound = await gpu_cluster.wait_bound([*first, last])
    assert len(set(bound.values())) == 2


async def test_oversized_gang_binds_nothing(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(1, gpus=8)
    scheduler()
    group = {
        "lj-runtimekit-scheduler/pod-group": "big",
        "lj-runtimekit-scheduler/pod-group-size": "3",
    }
    names = [
        gpu_cluster.pod(f"b-{i}", {"aliyun.com/gpu": "4"}, annotations=group) for i in range(3)
    ]
    await gpu_cluster.wait_refused(names, "does not fit in any one domain")
    assert not any(gpu_cluster.nodes_of(names).values())


async def test_a_16_pod_jobset_gang_lands_inside_one_block(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    # the harness labels racks by node index, across the blocks set here: a rack holding nodes
    # of both blocks must not count as one domain (it did, and the gang spanned the blocks)
    small = gpu_cluster.gpu_nodes(3, gpus=8, labels={"network.topology/block": "small"})
    big = gpu_cluster.gpu_nodes(5, gpus=8, labels={"network.topology/block": "big"})
    scheduler()
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "16",
    }
    # 16 × 2 GPUs = 4 nodes' worth: only the 5-node block holds it whole
    names = [
        gpu_cluster.pod(f"train-{i}", {"aliyun.com/gpu": "2"}, labels=labels) for i in range(16)
    ]
    bound = await gpu_cluster.wait_bound(names, deadline_s=90)
    assert set(bound.values()) <= set(big)
    assert not set(bound.values()) & set(small)


async def test_an_exclusive_block_gang_waits_whole_when_no_block_holds_it(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    blocks = [
        gpu_cluster.gpu_nodes(2, gpus=8, labels={"network.topology/block": f"x{b}"})
        for b in range(2)
    ]
    scheduler()
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "wide",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "6",
    }
    exclusive = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "network.topology/block"}
    # 6 × 4 GPUs = 24: the cluster has 32, each block 16; the gang must not be split
    names = [
        gpu_cluster.pod(f"wide-{i}", {"aliyun.com/gpu": "4"}, labels=labels, annotations=exclusive)
        for i in range(6)
    ]
    await gpu_cluster.wait_refused(names, "does not fit in any one domain")
    assert not any(gpu_cluster.nodes_of(names).values())
    # a third node in block x0 makes it hold the gang: it lands there whole
    more = gpu_cluster.gpu_nodes(1, gpus=8, labels={"network.topology/block": "x0"})
    bound = await gpu_cluster.wait_bound(names, deadline_s=60)
    assert set(bound.values()) == {*blocks[0], *more}


async def test_two_competing_gangs_both_complete_as_capacity_frees(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(2, gpus=8)
    scheduler()

    def gang(name: str) -> list[str]:
        group = {
            "lj-runtimekit-scheduler/pod-group": name,
            "lj-runtimekit-scheduler/pod-group-size": "4",
        }
        return [
            gpu_cluster.pod(f"{name}-{i}", {"aliyun.com/gpu": "4"}, annotations=group)
            for i in range(4)
        ]

    # each gang wants all 16 GPUs; created interleaved so neither is complete first by luck
    x, y = gang("x"), gang("y")

    def one_whole() -> list[str] | None:
        placed = gpu_cluster.nodes_of([*x, *y])
        done = [g for g in (x, y) if all(placed[n] for n in g)]
        return done[0] if done else None

    winner = await gpu_cluster.until("one gang bound whole", one_whole, 60)
    loser = y if winner is x else x
    await gpu_cluster.wait_refused(loser, "does not fit in any one domain")
    assert not any(gpu_cluster.nodes_of(loser).values()), "the waiting gang holds nothing"
    for name in winner:
        gpu_cluster.core.delete_namespaced_pod(name, gpu_cluster.namespace, grace_period_seconds=0)
    bound = await gpu_cluster.wait_bound(loser, deadline_s=90)
    assert len(set(bound.values())) == 2


CASES: list[tuple[str, dict[str, Any], dict[str, str] | None]] = [
    ("fits", {}, {"cpu": "1"}),
    ("too-much-cpu", {}, {"cpu": "1000"}),
    ("selector-miss", {"nodeSelector": {"nope": "x"}}, None),
    (
        "untolerated-affinity",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "sched-test", "operator": "DoesNotExist"}
                                ]
                            }
                        ]
                    }
                }
            }
        },
        None,
    ),
]


async def test_standard_constraints_match_kube_scheduler(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(1)
    scheduler()
    names = []
    for case, spec, limits in CASES:
        for who in ("default-scheduler", "lj-runtimekit-scheduler"):
            name = f"{case}-{'k' if who.startswith('default') else 'lj'}"
            extra = dict(spec)
            if case == "selector-miss":
                extra["nodeSelector"] = {"sched-test": gpu_cluster.tag, "nope": "x"}
            gpu_cluster.pod(name, limits, scheduler=who, **extra)
            names.append((case, name))
    await gpu_cluster.wait_decided([name for _, name in names])
    verdicts: dict[str, list[bool]] = {}
    for case, name in names:
        verdicts.setdefault(case, []).append(gpu_cluster.node_of(name) is not None)
    for case, (theirs, ours) in verdicts.items():
        assert theirs == ours, f"{case}: kube-scheduler bound={theirs}, ours bound={ours}"
    assert verdicts["fits"] == [True, True]
    assert verdicts["too-much-cpu"] == [False, False]
    assert any("Insufficient cpu" in e for e in gpu_cluster.events("too-much-cpu-lj"))


async def test_host_port_is_given_once_per_node(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(1)
    scheduler()
    ports = {
        "containers": [
            {"name": "main", "image": "busybox", "ports": [{"containerPort": 80, "hostPort": 8080}]}
        ]
    }
    names = [gpu_cluster.pod(f"port-{i}", None, **ports) for i in range(2)]

    def one_bound() -> bool:
        return any(gpu_cluster.nodes_of(names).values())

    await gpu_cluster.until("one port pod bound", one_bound)
    await gpu_cluster.wait_refused(names, "free ports")
    assert sum(1 for n in gpu_cluster.nodes_of(names).values() if n) == 1
    lost = next(n for n, node in gpu_cluster.nodes_of(names).items() if not node)
    assert any("free ports" in e for e in gpu_cluster.events(lost))
