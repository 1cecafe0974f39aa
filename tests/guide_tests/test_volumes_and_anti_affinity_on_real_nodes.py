"""The pods users really run, on two real GPU nodes (issue 35, "Done when", first bullet): kubelet +
containerd + runc per node, each with the Runtime simulator (``gpu-8x-nvlink``) on its sockets, the
suite deployed by deploy-all.sh from the built images, kube-controller-manager's PV and Deployment
controllers and kube-scheduler running beside lj-runtimekit-scheduler.

- A GPU-share pod with a ``WaitForFirstConsumer`` local PV lands on the PV's node although the other
  node, whose GPUs are busier, is the one binpack prefers; the scheduler binds the PV to the claim
  and the PV controller completes the binding; the kubelet mounts the node's directory (the
  container writes a file there, read back on the node); the Runtime holds the share, and gives it
  back once the pod is deleted.
- A 2-replica Deployment with required pod anti-affinity on ``kubernetes.io/hostname`` and a GPU
  share runs one replica per node, each with its share; scaled to 3, the third stays Pending with a
  FailedScheduling whose reasons are those kube-scheduler gives for the same pod on the same nodes
  (a twin pod under kube-scheduler, asked at the same moment).

Each test fails with its plugin switched off in the scheduler's ConfigMap (``plugins:
[{name: VolumeBinding, enabled: false}]``, resp. ``InterPodAffinity``): the pod is bound to the
busier node (and never starts there), resp. the third replica is bound beside one of the first two
(which the default spread constraints alone already keep apart)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.oracle.messages import Refusal, parse_kube, parse_ours
from lj_runtimekit_testkit.suite import (
    LAST_ACTION,
    Operator,
    accelerator_capacity,
    allocations,
    wait_for,
    workload,
)

from .conftest import RealCluster

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(600)]

WORK_NS = "placement"
CORE, MEM = "aliyun.com/gpu-core", "aliyun.com/gpu-memory"
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
OURS, KUBE = "lj-runtimekit-scheduler", "default-scheduler"
DISK = "/var/lib/lj-local-disks/ssd0"
"""The local PV's directory: under the node's private /var/lib, so it exists on one node only."""
IMAGE_USER = 65532
"""The suite images' user (their Dockerfiles' USER), which writes on the local disk."""
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
"""kube-scheduler's InterPodAffinity Filter words when the incoming pod's own required
anti-affinity rejects a node (ErrReasonAntiAffinityRulesNotMatch, checked before the existing
pods' anti-affinity)."""


@pytest.fixture(scope="module")
def nodes(real_cluster: RealCluster) -> tuple[Operator, RealNode, RealNode]:
    """Two GPU nodes, labelled, the suite deployed, each enabled by its agent Job and its shares
    registered with its kubelet."""
    rc = real_cluster
    for role in ("a", "b"):
        rc.operator.label(rc.add_node(role, "gpu-8x-nvlink").name, True)
    out = rc.operator.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op = rc.operator
    op.kubectl("create", "namespace", WORK_NS)
    for node in rc.named.values():
        wait_for(f"{node.name} enabled", functools.partial(enabled, op, node.name), 240)
        wait_for(f"{CORE} on {node.name}", functools.partial(registered, op, node.name), 60)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    return op, rc.named["a"], rc.named["b"]


def enabled(op: Operator, node: str) -> bool:
    raw = op.node(node)["metadata"].get("annotations", {}).get(LAST_ACTION, "{}")
    status: dict[str, Any] = json.loads(raw or "{}")
    if status.get("action") == "enable" and status.get("result") == "failed":
        raise AssertionError(f"enable failed on {node}: {status}")
    return bool(status.get("action") == "enable" and status.get("result") == "succeeded")


def registered(op: Operator, node: str) -> bool:
    cap = accelerator_capacity(op.node(node))
    return cap.get(CORE, "0") != "0" and cap.get(MEM, "0") != "0"


# ---------------------------------------------------------------------------- cluster reads


def create(op: Operator, body: dict[str, Any]) -> None:
    path = op.log_dir / f"{body['kind'].lower()}-{body['metadata']['name']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    op.kubectl("create", "-f", str(path))


def pod(op: Operator, name: str) -> dict[str, Any]:
    got: dict[str, Any] = op.json("-n", WORK_NS, "get", "pod", name)
    return got


def running(op: Operator, name: str) -> dict[str, Any] | None:
    got = pod(op, name)
    phase = got["status"].get("phase")
    if phase in ("Failed", "Succeeded"):
        raise AssertionError(f"pod {name} ended {phase}: {json.dumps(got['status'])[:2000]}")
    return got if phase == "Running" else None


def wait_running(op: Operator, name: str, deadline_s: float = 90) -> dict[str, Any]:
    try:
        return wait_for(f"pod {name} Running", functools.partial(running, op, name), deadline_s)
    except TimeoutError:
        described = op.kubectl("-n", WORK_NS, "describe", "pod", name, check=False).stdout
        raise AssertionError(f"pod {name} not Running:\n{described[-3000:]}") from None


def held_by(node: RealNode, name: str) -> list[dict[str, Any]]:
    """The Runtime's allocations on ``node`` for the pod ``name`` of the work namespace."""
    return [a for a in allocations(node) if a["pod"] == f"{WORK_NS}/{name}"]


def decision(p: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(p["metadata"]["annotations"][ASSIGNMENT])
    return found


def holds_its_share(node: RealNode, p: dict[str, Any], core: int) -> None:
    """The Runtime holds the share the scheduler decided for ``p``, on ``node``, and only it."""
    (device,) = decision(p)["containers"][0]["devices"]
    held = held_by(node, p["metadata"]["name"])
    assert [a["devices"] for a in held] == [[device["id"]]], (decision(p), held)
    assert held[0]["core_percent"] == core, held


def refusal(op: Operator, name: str, scheduler: str) -> Refusal | None:
    """The first FailedScheduling ``scheduler`` wrote about the pod ``name``, parsed."""
    for e in op.events("FailedScheduling", name):
        by = e.get("reportingComponent") or (e.get("source") or {}).get("component")
        if by == scheduler and e["metadata"]["namespace"] == WORK_NS:
            message = str(e.get("message") or e.get("note") or "")
            return parse_ours(message) if scheduler == OURS else parse_kube(message)
    return None


def released(nodes: tuple[RealNode, ...], names: list[str]) -> bool:
    return not [a for n in nodes for name in names for a in held_by(n, name)]


# ---------------------------------------------------------------------------- the objects


def local_storage(op: Operator, node: str) -> tuple[str, str, str]:
    """A no-provisioner WaitForFirstConsumer StorageClass, a local PV on ``node``'s ``DISK`` and an
    unbound claim of that class: (class, PV, claim)."""
    cls, pv, claim = "local-wffc", "local-ssd0", "dataset"
    create(
        op,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": cls},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    create(
        op,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": cls,
                "local": {"path": DISK},
                "nodeAffinity": {
                    "required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}
                },
            },
        },
    )
    create(
        op,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": WORK_NS},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": cls,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    return cls, pv, claim


WRITER = """\
import os, pathlib, signal, sys
pathlib.Path("/data/written-by-pod").write_text(os.environ["HOSTNAME"])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.pause()
"""
"""The container: writes its pod's name on the claim's volume, then waits (PID 1 ignores an
unhandled SIGTERM)."""


def writer(name: str, claim: str, image: str, share: dict[str, str]) -> dict[str, Any]:
    body = workload(name, WORK_NS, share)
    spec = body["spec"]
    container = spec["containers"][0]
    container.update(image=image, command=["python3", "-c", WRITER], args=[])
    container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return body


def replicas_deployment(name: str, share: dict[str, str]) -> dict[str, Any]:
    template = workload(name, WORK_NS, share)
    spec = template["spec"]
    spec["restartPolicy"] = "Always"
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": name}},
                }
            ]
        }
    }
    labels = {"app": name, "role": "replica"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": WORK_NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def replica_pods(op: Operator, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = op.json(
        "-n", WORK_NS, "get", "pods", "-l", f"app={app},role=replica"
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def clean(op: Operator, *objects: str) -> None:
    for obj in objects:
        ns = [] if obj.split("/")[0] in ("storageclass", "pv") else ["-n", WORK_NS]
        op.kubectl(*ns, "delete", obj, "--ignore-not-found", "--wait=true", "--timeout=90s")


# ---------------------------------------------------------------------------- the tests


@pytest.fixture
def cleanup(nodes: tuple[Operator, RealNode, RealNode]) -> Iterator[list[str]]:
    """Objects a test made, deleted after it in the order listed (whatever its outcome), so the
    next test starts from idle nodes."""
    made: list[str] = []
    yield made
    clean(nodes[0], *made)


def test_a_wait_for_first_consumer_local_pv_takes_a_gpu_share_pod_to_its_node(
    nodes: tuple[Operator, RealNode, RealNode], real_cluster: RealCluster, cleanup: list[str]
) -> None:
    op, busy, disk_node = nodes
    share = {CORE: "50", MEM: "20"}
    # The other node's GPUs get busier first: binpack prefers it for a share, so only the PV's
    # node affinity takes the pod to disk_node.
    cleanup += ["pod/elsewhere", "pod/trainer", "pvc/dataset", "pv/local-ssd0"]
    cleanup += ["storageclass/local-wffc"]
    create(op, workload("elsewhere", WORK_NS, {CORE: "30", MEM: "10"}, node=busy.name))
    disk = disk_node.host_path(DISK)
    disk.mkdir(parents=True)
    os.chown(disk, IMAGE_USER, IMAGE_USER)
    _, pv, claim = local_storage(op, disk_node.name)
    holds_its_share(busy, wait_running(op, "elsewhere"), 30)

    (image,) = [i.ref for i in real_cluster.images if i.component == "scheduler"]
    create(op, writer("trainer", claim, image, share))
    placed = wait_for("trainer bound", lambda: pod(op, "trainer")["spec"].get("nodeName"), 60, 0.5)
    assert placed == disk_node.name, placed
    trainer = wait_running(op, "trainer")
    assert decision(trainer)["node"] == disk_node.name
    # kube-scheduler's binding of a pre-made PV: the PV's claimRef names the claim (the
    # selected-node annotation is for claims to provision); the PV controller completes it.
    volume = op.json("get", "pv", pv)
    assert volume["spec"]["claimRef"]["name"] == claim, volume["spec"]
    assert volume["spec"]["claimRef"]["namespace"] == WORK_NS, volume["spec"]

    def claim_bound() -> dict[str, Any] | None:
        c: dict[str, Any] = op.json("-n", WORK_NS, "get", "pvc", claim)
        return c if c["status"].get("phase") == "Bound" else None

    bound = wait_for(f"claim {claim} Bound", claim_bound, 30, 0.5)
    assert bound["spec"]["volumeName"] == pv
    annotations = bound["metadata"].get("annotations", {})
    assert annotations.get("pv.kubernetes.io/bind-completed") == "yes", annotations
    assert SELECTED_NODE not in annotations, annotations
    # the kubelet mounted the node's own directory: what the container wrote is there
    written = disk / "written-by-pod"
    wait_for("the pod's file on the node's disk", written.is_file, 30, 0.2)
    assert written.read_text() == "trainer"
    holds_its_share(disk_node, trainer, 50)

    op.kubectl("-n", WORK_NS, "delete", "pod", "trainer", "--wait=true", "--timeout=60s")
    wait_for("the trainer's share released", lambda: not held_by(disk_node, "trainer"), 60)
    holds_its_share(busy, pod(op, "elsewhere"), 30)


def test_required_anti_affinity_puts_gpu_share_replicas_on_different_nodes(
    nodes: tuple[Operator, RealNode, RealNode], cleanup: list[str]
) -> None:
    op, a, b = nodes
    by_name = {a.name: a, b.name: b}
    share = {CORE: "40", MEM: "16"}
    cleanup += ["deployment/serve", "pod/serve-twin"]
    create(op, replicas_deployment("serve", share))

    def two_running() -> list[dict[str, Any]] | None:
        pods = replica_pods(op, "serve")
        up = [p for p in pods if p["status"].get("phase") == "Running"]
        return up if len(up) == 2 else None

    replicas = wait_for("2 replicas Running", two_running, 90)
    placed = sorted(p["spec"]["nodeName"] for p in replicas)
    assert placed == sorted(by_name), placed
    for p in replicas:
        assert decision(p)["node"] == p["spec"]["nodeName"]
        holds_its_share(by_name[p["spec"]["nodeName"]], p, 40)

    op.kubectl("-n", WORK_NS, "scale", "deployment/serve", "--replicas=3")
    first = {p["metadata"]["name"] for p in replicas}

    def the_third() -> list[dict[str, Any]]:
        return [p for p in replica_pods(op, "serve") if p["metadata"]["name"] not in first]

    (pending,) = wait_for("the third replica", the_third, 30, 0.5)
    name = pending["metadata"]["name"]

    def refused() -> Refusal | None:
        placed = pod(op, name)["spec"].get("nodeName")
        assert not placed, f"the third replica {name} was bound to {placed}, beside a replica"
        return refusal(op, name, OURS)

    ours = wait_for("our FailedScheduling", refused, 30, 0.5)
    # The same pod under kube-scheduler (its labels match the anti-affinity of the replicas, not
    # the Deployment's selector, so the ReplicaSet leaves it alone).
    twin = workload("serve-twin", WORK_NS, share, scheduler=KUBE)
    twin["metadata"]["labels"] = {"app": "serve"}
    twin["spec"]["affinity"] = pending["spec"]["affinity"]
    create(op, twin)
    kube = wait_for(
        "kube-scheduler's FailedScheduling", lambda: refusal(op, "serve-twin", KUBE), 30, 0.5
    )

    assert kube.counts == {ANTI_AFFINITY: 2}, kube.raw
    assert (ours.nodes, ours.counts) == (kube.nodes, kube.counts), (ours.raw, kube.raw)
    assert ours.plugins == {ANTI_AFFINITY: "InterPodAffinity"}, ours.raw
    assert not pod(op, name)["spec"].get("nodeName")
    assert not pod(op, "serve-twin")["spec"].get("nodeName")

    op.kubectl("-n", WORK_NS, "delete", "deployment/serve", "--wait=true", "--timeout=60s")
    wait_for("the replicas' shares released", lambda: released((a, b), sorted(first)), 60)
