"""Preemption on a real node (issue 35, "Done when", first bullet, its third part): the suite
deployed by deploy-all.sh from the built images (the scheduler with its RBAC and admission
policy), one real node with eight GPUs (kubelet + containerd + runc, the Runtime simulator), all
eight held by pods of lower priority — seven whole GPUs at a middle priority, two shares of the
eighth at the lowest. A high-priority whole-GPU pod preempts exactly the two shares (the pods
holding the GPU it gets: the lowest priority, and one GPU), which are marked, deleted and whose
allocations the Runtime releases; then it runs on that GPU. The seven whole pods run on."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    LAST_ACTION,
    Operator,
    accelerator_capacity,
    allocations,
    wait_for,
    workload,
)

from .conftest import RealCluster

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

WORK_NS = "preemption"
GPU, CORE, MEM = "aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory"
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
CLASSES = {"ljrk-test-low": 1, "ljrk-test-mid": 5, "ljrk-test-high": 1000}


@pytest.fixture(scope="module")
def deployed(real_cluster: RealCluster) -> tuple[Operator, RealNode]:
    """One GPU node, labelled and enabled, the suite deployed, three PriorityClasses."""
    rc = real_cluster
    node = rc.add_node("gpu", "gpu-8x-nvlink")
    rc.operator.label(node.name, True)
    out = rc.operator.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op = rc.operator
    op.kubectl("create", "namespace", WORK_NS)
    wait_for(f"{node.name} enabled", functools.partial(_enabled, op, node.name), 240)
    wait_for(f"{GPU} registered", lambda: accelerator_capacity(op.node(node.name)).get(GPU), 60)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    classes = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            for name, value in CLASSES.items()
        ],
    }
    _create(op, "classes", classes)
    return op, node


def _enabled(op: Operator, node: str) -> bool:
    raw = op.node(node)["metadata"].get("annotations", {}).get(LAST_ACTION, "{}")
    status: dict[str, Any] = json.loads(raw or "{}")
    return bool(status.get("action") == "enable" and status.get("result") == "succeeded")


def _create(op: Operator, name: str, body: dict[str, Any]) -> None:
    path = op.log_dir / f"preemption-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    op.kubectl("create", "-f", str(path))


def _pod(name: str, limits: dict[str, str], priority_class: str) -> dict[str, Any]:
    body = workload(name, WORK_NS, limits)
    body["spec"]["priorityClassName"] = priority_class
    return body


def _pods(op: Operator) -> dict[str, dict[str, Any]]:
    items = op.json("-n", WORK_NS, "get", "pods")["items"]
    return {p["metadata"]["name"]: p for p in items}


def _running(op: Operator, names: list[str]) -> dict[str, dict[str, Any]] | None:
    by_name = _pods(op)
    for n in names:
        phase = by_name.get(n, {}).get("status", {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {n} ended {phase}: {json.dumps(by_name[n]['status'])}")
        if phase != "Running":
            return None
    return {n: by_name[n] for n in names}


def _devices(pod: dict[str, Any]) -> list[str]:
    doc = json.loads(pod["metadata"]["annotations"][ASSIGNMENT])
    return [d["id"] for c in doc["containers"] for d in c["devices"]]


def _held(node: RealNode, name: str) -> list[str]:
    """The devices the Runtime's allocations of pod ``name`` hold."""
    return [d for a in allocations(node) if a["pod"] == f"{WORK_NS}/{name}" for d in a["devices"]]


def test_a_high_priority_whole_gpu_pod_preempts_exactly_the_pods_holding_its_gpu(
    deployed: tuple[Operator, RealNode],
) -> None:
    op, node = deployed
    share = {CORE: "50", MEM: "20"}
    shares = ["share-a", "share-b"]
    for name in shares:  # first: both on one GPU (binpack), the others then take one each
        _create(op, name, _pod(name, share, "ljrk-test-low"))
    low = wait_for("the shares running", functools.partial(_running, op, shares), 180)
    (gpu,) = {d for p in low.values() for d in _devices(p)}
    wholes = [f"whole-{i}" for i in range(7)]
    for name in wholes:
        _create(op, name, _pod(name, {GPU: "1"}, "ljrk-test-mid"))
    mid = wait_for("the whole pods running", functools.partial(_running, op, wholes), 300)
    assert gpu not in {d for p in mid.values() for d in _devices(p)}
    for name in shares:
        assert _held(node, name) == [gpu], allocations(node)

    _create(op, "high", _pod("high", {GPU: "1"}, "ljrk-test-high"))
    high = wait_for("the preemptor running", functools.partial(_running, op, ["high"]), 300)
    assert _devices(high["high"]) == [gpu]
    assert _held(node, "high") == [gpu], allocations(node)
    left = _pods(op)
    assert not set(shares) & set(left), "both shares were preempted"
    assert set(wholes) <= set(left)
    assert all(not left[n]["metadata"].get("deletionTimestamp") for n in wholes)
    assert all(_held(node, n) for n in wholes), allocations(node)
    wait_for(
        "the Runtime released the shares' allocations",
        lambda: not any(_held(node, n) for n in shares),
        60,
    )
    uid = high["high"]["metadata"]["uid"]
    for name in shares:
        notes = [e.get("message", "") for e in op.events("Preempted", name)]
        assert f"Preempted by pod {uid} on node {node.name}" in notes, notes
