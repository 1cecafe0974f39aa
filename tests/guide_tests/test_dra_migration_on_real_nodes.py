"""Moving a node between the device plugin and DRA with GPU pods running (#24 item 4; docs/dra.md,
"Migrating a node without disturbing running pods"): the suite deployed by deploy-all.sh from the
built images on a real node (kubelet + containerd + runc) with eight GPUs of the Runtime
simulator, no cordon, no drain.

To DRA: a device-plugin pod holding one GPU keeps running across the relabel (same uid, no
restart, its Runtime allocation unchanged); its GPU is published tainted held-by-device-plugin,
so a claim for seven GPUs gets the seven others; deleting the old pod releases its allocation
(the device plugin's reconciler runs in DRA mode for it) and clears the taint.

Back to the device plugin, with that seven-GPU DRA pod running: it keeps running; the node's
slices are withdrawn; the kubelet gets its seven GPUs as Unhealthy, so a new device-plugin pod
gets the eighth; deleting the DRA pod unprepares it through the device plugin's DRA service
(Runtime release, CDI spec gone) and the node advertises all eight GPUs again."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import NS, Operator, all_running, allocations, wait_for, workload

from .conftest import RealCluster
from .test_lifecycle_on_real_nodes import enabled

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(1200)]

WORK_NS = "migration"
DRIVER = "lj-runtimekit.aliyun.com"
GPU = "aliyun.com/gpu"
GPU_CLASS = "gpu.lj-runtimekit.aliyun.com"
MODE_LABEL = "lj_runtimekit_device_mode"
DEVICE_PLUGIN, DRA_PLUGIN = "lj-runtimekit-device-plugin", "lj-runtimekit-dra-plugin"
HELD_TAINT = "lj-runtimekit.aliyun.com/held-by-device-plugin"
#: Two reconcile passes (30 s apart by default) after the grace period, and the write.
RELEASE_S = 150


@pytest.fixture(scope="module")
def node(real_cluster: RealCluster) -> RealNode:
    """A node in device-plugin mode (no mode label) with the suite deployed."""
    rc = real_cluster
    node = rc.add_node("migration", "gpu-8x-nvlink")
    op = rc.operator
    op.label(node.name, True)
    out = op.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op.kubectl("create", "namespace", WORK_NS)
    wait_for(f"{node.name} enabled", functools.partial(enabled, op, node.name), 240)
    wait_for("the device plugin running", lambda: plugin_pod(op, node, DEVICE_PLUGIN), 180)
    wait_for("eight GPUs allocatable", lambda: allocatable(op, node) == 8, 120)
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


def plugin_pod(op: Operator, node: RealNode, app: str) -> dict[str, Any] | None:
    pods = op.json(
        "-n", NS, "get", "pods", "-l", f"app={app}", "--field-selector",
        f"spec.nodeName={node.name}",
    )["items"]  # fmt: skip
    return pods[0] if len(pods) == 1 and all_running(pods) else None


def no_plugin_pod(op: Operator, node: RealNode, app: str) -> bool:
    return not op.json(
        "-n", NS, "get", "pods", "-l", f"app={app}", "--field-selector",
        f"spec.nodeName={node.name}",
    )["items"]  # fmt: skip


def allocatable(op: Operator, node: RealNode) -> int:
    return int(op.node(node.name)["status"].get("allocatable", {}).get(GPU, "0"))


def switch(op: Operator, node: RealNode, *, dra: bool) -> None:
    """Relabel the node and wait until only the other mode's plugin runs there."""
    label = f"{MODE_LABEL}=dra" if dra else f"{MODE_LABEL}-"
    op.kubectl("label", "node", node.name, label, "--overwrite")
    new, old = (DRA_PLUGIN, DEVICE_PLUGIN) if dra else (DEVICE_PLUGIN, DRA_PLUGIN)
    wait_for(f"{old} gone from the node", lambda: no_plugin_pod(op, node, old), 180)
    wait_for(f"{new} running on the node", lambda: plugin_pod(op, node, new), 180)


def devices(op: Operator, node: RealNode) -> dict[str, dict[str, Any]]:
    """Runtime device id → its entry in the node's ResourceSlices."""
    items = op.json(
        "get", "resourceslices", "--field-selector",
        f"spec.nodeName={node.name},spec.driver={DRIVER}",
    )["items"]  # fmt: skip
    return {
        d["attributes"]["runtimeDeviceID"]["string"]: d
        for s in items
        for d in s["spec"].get("devices", [])
    }


def held_taints(op: Operator, node: RealNode) -> dict[str, list[dict[str, Any]]]:
    return {
        gpu: [t for t in d.get("taints", []) if t["key"] == HELD_TAINT]
        for gpu, d in devices(op, node).items()
    }


def apply(op: Operator, name: str, *objs: dict[str, Any]) -> None:
    path = op.log_dir / f"migration-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))
    op.kubectl("apply", "-f", str(path))


def running(op: Operator, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = op.json("-n", WORK_NS, "get", "pod", name)
    if pod["status"].get("phase") == "Failed":
        raise AssertionError(f"pod {name} failed: {pod['status']}")
    return pod if all_running([pod]) else None


def held(node: RealNode, pod: str) -> list[dict[str, Any]]:
    return [a for a in allocations(node) if a["pod"] == f"{WORK_NS}/{pod}"]


def device_plugin_pod(op: Operator, node: RealNode, name: str) -> dict[str, Any]:
    """A pod asking ``aliyun.com/gpu: 1`` (default scheduler), once Running and attributed."""
    apply(op, name, workload(name, WORK_NS, {GPU: "1"}, node=node.name, scheduler=None))
    pod = wait_for(f"pod {name} running", lambda: running(op, name), 180)
    # a whole GPU placed by kube-scheduler is owned by its pod once the reconciler re-owns it
    wait_for(f"{name}'s allocation attributed", lambda: held(node, name), 120)
    return pod


def seven_gpu_claim_pod(op: Operator, node: RealNode, name: str) -> dict[str, Any]:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORK_NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": 7}}
                    ]
                }
            }
        },
    }
    pod = workload(name, WORK_NS, {}, node=node.name, scheduler=None)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": name}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    apply(op, name, template, pod)
    return wait_for(f"pod {name} running", lambda: running(op, name), 180)


def unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    (status,) = after["status"]["containerStatuses"]
    assert status["restartCount"] == 0, status


def cdi_specs(node: RealNode) -> list[str]:
    d = node.host_path("/var/run/cdi")
    return sorted(p.name for p in d.glob("*.json")) if d.is_dir() else []


def test_to_dra_and_back_with_gpu_pods_running(op: Operator, node: RealNode) -> None:
    # ---------------------------------------------------------------- device plugin → DRA
    old = device_plugin_pod(op, node, "dp-old")
    (old_alloc,) = held(node, "dp-old")
    (gpu,) = old_alloc["devices"]
    switch(op, node, dra=True)
    wait_for("eight GPUs in the slices", lambda: len(devices(op, node)) == 8, 120)
    taints = held_taints(op, node)
    assert [g for g, t in taints.items() if t] == [gpu], taints
    (taint,) = taints[gpu]
    assert (taint["value"], taint["effect"]) == (f"{WORK_NS}.dp-old", "NoSchedule")
    unchanged(old, wait_for("dp-old still running", lambda: running(op, "dp-old"), 30))
    assert held(node, "dp-old") == [old_alloc]

    seven = seven_gpu_claim_pod(op, node, "seven")
    (seven_alloc,) = held(node, "seven")
    assert gpu not in seven_alloc["devices"]
    assert len(seven_alloc["devices"]) == 7

    op.kubectl("-n", WORK_NS, "delete", "pod", "dp-old", "--wait=true", "--timeout=120s")
    wait_for("dp-old's allocation released", lambda: not held(node, "dp-old"), RELEASE_S)
    wait_for("the taint cleared", lambda: not any(held_taints(op, node).values()), 60)
    assert held(node, "seven") == [seven_alloc]

    # ---------------------------------------------------------------- DRA → device plugin
    switch(op, node, dra=False)
    unchanged(seven, wait_for("seven still running", lambda: running(op, "seven"), 30))
    assert held(node, "seven") == [seven_alloc]
    wait_for("the node's slices withdrawn", lambda: not devices(op, node), 60)
    # the claim's seven GPUs are Unhealthy to the kubelet: one GPU allocatable
    wait_for("one GPU allocatable", lambda: allocatable(op, node) == 1, 120)
    fresh = device_plugin_pod(op, node, "dp-new")
    (fresh_alloc,) = held(node, "dp-new")
    assert fresh_alloc["devices"] == [gpu], (fresh_alloc, seven_alloc)
    assert fresh["metadata"]["uid"]
    assert len(cdi_specs(node)) == 1

    op.kubectl("-n", WORK_NS, "delete", "pod", "seven", "--wait=true", "--timeout=120s")
    wait_for("seven's allocation released", lambda: not held(node, "seven"), 120)
    wait_for("its CDI spec removed", lambda: not cdi_specs(node), 60)
    wait_for("all eight GPUs allocatable", lambda: allocatable(op, node) == 8, 120)
    registration = node.host_path(f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock")
    wait_for("the DRA registration withdrawn", lambda: not registration.exists(), 60)
    assert held(node, "dp-new") == [fresh_alloc]
    op.kubectl("-n", WORK_NS, "delete", "pod", "dp-new", "--wait=true", "--timeout=120s")
    op.kubectl("-n", WORK_NS, "delete", "resourceclaimtemplate", "seven")
    wait_for("dp-new's allocation released", lambda: not held(node, "dp-new"), RELEASE_S)
