"""GPU shares through DRA on a real node (#24, "Done when": "a share (30 % + 10 GiB) beside another
share on the same GPU"): the suite deployed by deploy-all.sh from the built images on a real node
(kubelet + containerd + runc) with eight GPUs of the Runtime simulator, the node labelled for DRA
mode; kube-scheduler allocates the claims from the GPUs' consumable capacity, the kubelet calls
our DRA plugin, which asks the Runtime for a share of exactly what the claim consumed.

Two share claims on one GPU each give a pod that runs with the Runtime's share limits
(``LJ_GPU_CORE_PERCENT``, ``LJ_GPU_MEMORY_LIMIT_BYTES``) reaching the container through CDI, the
Runtime holding two shared allocations on that GPU; a claim for a whole GPU meanwhile gets
another GPU; deleting the pods releases everything in the Runtime and removes their CDI specs."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    NS,
    Operator,
    all_running,
    allocations,
    injected,
    wait_for,
    workload,
)

from .conftest import RealCluster
from .test_lifecycle_on_real_nodes import enabled

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

WORK_NS = "dra-shares"
DRIVER = "lj-runtimekit.aliyun.com"
GPU_CLASS = "gpu.lj-runtimekit.aliyun.com"
SHARE_CLASS = "gpu-share.lj-runtimekit.aliyun.com"
MODE_LABEL = "lj_runtimekit_device_mode"
PLUGIN_APP = "lj-runtimekit-dra-plugin"
GIB = 1 << 30


@pytest.fixture(scope="module")
def node(real_cluster: RealCluster) -> RealNode:
    rc = real_cluster
    node = rc.add_node("dra", "gpu-8x-nvlink")
    op = rc.operator
    op.label(node.name, True)
    op.kubectl("label", "node", node.name, f"{MODE_LABEL}=dra", "--overwrite")
    out = op.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op.kubectl("create", "namespace", WORK_NS)
    wait_for(f"{node.name} enabled", functools.partial(enabled, op, node.name), 240)
    wait_for("the DRA plugin running", lambda: plugin_pod(op, node), 180)
    wait_for("eight GPUs in the node's ResourceSlices", lambda: len(devices(op, node)) == 8, 120)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    return node


@pytest.fixture
def op(real_cluster: RealCluster) -> Operator:
    return real_cluster.operator


def plugin_pod(op: Operator, node: RealNode) -> dict[str, Any] | None:
    pods = op.json(
        "-n", NS, "get", "pods", "-l", f"app={PLUGIN_APP}", "--field-selector",
        f"spec.nodeName={node.name}",
    )["items"]  # fmt: skip
    return pods[0] if len(pods) == 1 and all_running(pods) else None


def devices(op: Operator, node: RealNode) -> dict[str, dict[str, Any]]:
    """Device name → its entry in the node's ResourceSlices."""
    slices = op.json(
        "get", "resourceslices", "--field-selector",
        f"spec.nodeName={node.name},spec.driver={DRIVER}",
    )["items"]  # fmt: skip
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def claim_pod(op: Operator, node: RealNode, name: str, request: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaimTemplate of one request (``exactly``) and a pod (default scheduler) using
    it; the pod once Running."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORK_NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }
    pod = workload(name, WORK_NS, {}, node=node.name, scheduler=None)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": name}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    path = op.log_dir / f"dra-shares-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [template, pod]}))
    op.kubectl("apply", "-f", str(path))
    return wait_for(f"pod {name} running", lambda: running(op, name), 180)


def share(cores: int, memory: str, on: str = "") -> dict[str, Any]:
    request: dict[str, Any] = {
        "deviceClassName": SHARE_CLASS,
        "capacity": {"requests": {"cores": str(cores), "memory": memory}},
    }
    if on:  # beside the share already on this GPU (the Runtime's device id)
        attr = f'device.attributes["{DRIVER}"].runtimeDeviceID'
        request["selectors"] = [{"cel": {"expression": f'{attr} == "{on}"'}}]
    return request


def running(op: Operator, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = op.json("-n", WORK_NS, "get", "pod", name)
    if pod["status"].get("phase") == "Failed":
        raise AssertionError(f"pod {name} failed: {pod['status']}")
    return pod if all_running([pod]) else None


def held(node: RealNode, pod: str) -> list[dict[str, Any]]:
    return [a for a in allocations(node) if a["pod"] == f"{WORK_NS}/{pod}"]


def env_of(node: RealNode, pod: dict[str, Any]) -> dict[str, str]:
    (record,) = injected(node, pod["metadata"]["uid"])
    return dict(e.split("=", 1) for e in record.get("env", []))


def claim_results(op: Operator, pod: dict[str, Any]) -> list[dict[str, Any]]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = op.json("-n", WORK_NS, "get", "resourceclaim", status["resourceClaimName"])
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results


def cdi_specs(node: RealNode) -> list[str]:
    d = node.host_path("/var/run/cdi")
    return sorted(p.name for p in d.glob("*.json")) if d.is_dir() else []


def test_shareable_gpus_are_published_with_consumable_capacity(
    op: Operator, node: RealNode
) -> None:
    for d in devices(op, node).values():
        assert d.get("allowMultipleAllocations") is True
        assert d["capacity"]["cores"]["value"] == "100"
        assert (
            d["capacity"]["memory"]["requestPolicy"]["default"] == d["capacity"]["memory"]["value"]
        )
    classes = {c["metadata"]["name"] for c in op.json("get", "deviceclasses")["items"]}
    assert {GPU_CLASS, SHARE_CLASS} <= classes


def test_two_shares_run_on_one_gpu_with_the_runtimes_limits_and_a_whole_gpu_goes_elsewhere(
    op: Operator, node: RealNode
) -> None:
    first = claim_pod(op, node, "share-a", share(30, "10Gi"))
    (a,) = held(node, "share-a")
    (gpu,) = a["devices"]
    second = claim_pod(op, node, "share-b", share(50, "20Gi", on=gpu))
    (b,) = held(node, "share-b")
    assert b["devices"] == [gpu]
    assert (a["core_percent"], a["memory_bytes"]) == (30, 10 * GIB)
    assert (b["core_percent"], b["memory_bytes"]) == (50, 20 * GIB)
    on_gpu = [x for x in allocations(node) if gpu in x["devices"]]
    assert sorted(x["id"] for x in on_gpu) == sorted([a["id"], b["id"]])

    for pod, alloc, cores, memory in ((first, a, 30, 10 * GIB), (second, b, 50, 20 * GIB)):
        env = env_of(node, pod)
        assert env.get("LJ_GPU_CORE_PERCENT") == str(cores), env
        assert env.get("LJ_GPU_MEMORY_LIMIT_BYTES") == str(memory), env
        assert env.get("LJ_ALLOCATION_ID") == alloc["id"]
        assert env.get("LJ_VISIBLE_DEVICES") == gpu
        (result,) = claim_results(op, pod)
        assert result["shareID"]
        assert result["consumedCapacity"] == {"cores": str(cores), "memory": f"{memory // GIB}Gi"}
    assert len(cdi_specs(node)) == 2

    # a claim for a whole GPU consumes all of one: never the shared one
    whole = claim_pod(op, node, "whole", {"deviceClassName": GPU_CLASS, "count": 1})
    (w,) = held(node, "whole")
    assert w["devices"] != [gpu]
    assert (w["core_percent"], w["memory_bytes"]) == (0, 0)
    assert "LJ_GPU_CORE_PERCENT" not in env_of(node, whole)

    for name in ("share-a", "share-b", "whole"):
        op.kubectl("-n", WORK_NS, "delete", "pod", name, "--wait=true", "--timeout=120s")
    wait_for("the shares and the whole GPU released", lambda: not allocations(node), 120)
    wait_for("their CDI specs removed", lambda: not cdi_specs(node), 60)
    for name in ("share-a", "share-b", "whole"):
        op.kubectl("-n", WORK_NS, "delete", "resourceclaimtemplate", name)
