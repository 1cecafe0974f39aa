"""Least privilege, proven with each component's real token on the real control plane
(issue 19 §1, docs/security.md): every escape an attacker holding a token tried is refused, by
RBAC (403) or by the component's admission policy (its message), and every call the component's
code really makes still succeeds with the same token."""

from __future__ import annotations

import asyncio
import copy
import itertools
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as aclient

from lj_runtimekit_controller import job_spec
from lj_runtimekit_controller.partition_layout import from_yaml
from lj_runtimekit_device_plugin import kube as plugin_kube
from lj_runtimekit_operator import bundled as operator_bundle
from lj_runtimekit_operator import policy as operator_policy
from lj_runtimekit_operator import render as operator_render
from lj_runtimekit_testkit.manifests import CHART, Obj, tool_dir

from .conftest import NS, Reply, Rig, eventually, kubectl, ok, pod_body

pytestmark = pytest.mark.cluster

RBAC = "rbac"
"""Refused by RBAC: 403 naming the ServiceAccount and the verb it lacks."""
PREEMPTS_ONLY = "may only delete a pod it preempts"
"""The scheduler's admission policy on a pod deletion it was not marked for."""


@dataclass(frozen=True)
class Objects:
    """What the attacks aim at: another tenant's pods and a Job that is not the suite's."""

    tenant: str
    """A running pod of another tenant on the attacker's node."""
    elsewhere: str
    """A pod of another tenant on another node."""
    pending: str
    """A pending pod that names the suite's scheduler."""
    foreign_job: str
    """A Job in kube-system that is not an agent Job."""
    critical: str
    """A running pod of a system priority class in kube-system (marked as preempted by someone
    else, DisruptionTarget/PreemptionByScheduler, just before the attack on it)."""
    stranger: str
    """A pending pod that names another scheduler."""
    bound_pv: str = ""
    """A PersistentVolume bound to another tenant's claim ``claim``."""
    free_pv: str = ""
    """A PersistentVolume that names no claim yet."""
    claim: str = ""
    """Another tenant's PersistentVolumeClaim (bound to ``bound_pv``)."""


PVS = "/api/v1/persistentvolumes"


def _pv(name: str, claim: tuple[str, str] | None = None, cls: str = "sec-test") -> Obj:
    """A PV; kube-controller-manager's PV controller binds it only to a claim of class ``cls``
    (no StorageClass of that name exists: binding is Immediate)."""
    spec: Obj = {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": cls,
        "hostPath": {"path": f"/tmp/{name}"},
    }
    if claim is not None:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": spec,
    }


def _pvc(name: str, cls: str = "sec-test") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cls,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def _claims_path(rig: Rig) -> str:
    return f"/api/v1/namespaces/{rig.victims}/persistentvolumeclaims"


def _changed(rig: Rig, path: str, change: Callable[[Obj], None]) -> Obj:
    """The object at ``path`` as the apiserver has it now, with ``change`` made (for a PUT)."""
    obj = ok(rig.root("GET", path, None), path)
    change(obj)
    return obj


def _phase(rig: Rig, path: str, phase: str) -> Callable[[], bool]:
    """Whether the object at ``path`` is in ``phase`` (the PV controller settled it: a PUT made
    from a read before that would meet a 409 instead of the policy)."""
    return lambda: rig.root("GET", path, None).body.get("status", {}).get("phase") == phase


@pytest.fixture(scope="module")
def objs(rig: Rig) -> Iterator[Objects]:
    run = uuid.uuid4().hex[:6]
    o = Objects(
        f"tenant-{run}",
        f"elsewhere-{run}",
        f"pending-{run}",
        f"foreign-{run}",
        f"critical-{run}",
        f"stranger-{run}",
        bound_pv=f"sec-bound-{run}",
        free_pv=f"sec-free-{run}",
        claim=f"data-{run}",
    )
    pods = f"/api/v1/namespaces/{rig.victims}/pods"
    ok(rig.root("POST", pods, pod_body(o.tenant, rig.own_node)), "tenant pod")
    ok(rig.root("POST", pods, pod_body(o.elsewhere, rig.other_node)), "pod elsewhere")
    pending = pod_body(o.pending, None, schedulerName="lj-runtimekit-scheduler")
    ok(rig.root("POST", pods, pending), "pending pod")
    stranger = pod_body(o.stranger, None, schedulerName="someone-else")
    ok(rig.root("POST", pods, stranger), "a pending pod of another scheduler")
    job = {
        "metadata": {"name": o.foreign_job},
        "spec": {"suspend": True, "template": {"spec": pod_body("x", None)["spec"]}},
    }
    ok(rig.root("POST", JOBS, job), "a Job not of the suite")
    critical = pod_body(o.critical, rig.own_node, priorityClassName="system-node-critical")
    ok(rig.root("POST", f"/api/v1/namespaces/{NS}/pods", critical), "a system-critical pod")
    _running(rig, _pods(rig, o.critical, NS))
    ok(rig.root("POST", _claims_path(rig), _pvc(o.claim)), "another tenant's claim")
    ok(rig.root("POST", PVS, _pv(o.bound_pv, (rig.victims, o.claim))), "a PV bound to it")
    ok(rig.root("POST", PVS, _pv(o.free_pv, cls="sec-test-free")), "a free PV")
    try:
        eventually(
            "the tenant's claim Bound", _phase(rig, f"{_claims_path(rig)}/{o.claim}", "Bound")
        )
        eventually("the free PV Available", _phase(rig, f"{PVS}/{o.free_pv}", "Available"))
        yield o
    finally:
        rig.root("DELETE", f"{JOBS}/{o.foreign_job}", {"propagationPolicy": "Background"})
        rig.root("DELETE", _pods(rig, o.critical, NS), {"gracePeriodSeconds": 0})
        for name in (o.bound_pv, o.free_pv):
            rig.root("DELETE", f"{PVS}/{name}", None)


def agent_job(rig: Rig, node: str | None = None, action: str = "enable") -> Obj:
    """The Job the controller really creates (its own job_spec), for ``node``."""
    t = job_spec.JobTemplate(image=rig.job_image)
    layout = None
    if action == "partition":
        layout = from_yaml("mig-2", "- {devices: [0], mig: [3g.40gb]}")
    m = job_spec.manifest(t, node or rig.own_node, action, 1, layout)
    m["metadata"]["name"] = f"{m['metadata']['name'][:40]}-{uuid.uuid4().hex[:6]}"
    return m


def tampered(rig: Rig, change: Callable[[Obj, Obj, Obj], None], action: str = "enable") -> Obj:
    """An agent Job of ``action`` with one change made by ``change(job, pod_spec, container)``."""
    m = copy.deepcopy(agent_job(rig, action=action))
    pod = m["spec"]["template"]["spec"]
    change(m, pod, pod["containers"][0])
    return m


def _pod_resources_mount(container: Obj) -> Obj:
    mounts: list[Obj] = container["volumeMounts"]
    (m,) = (m for m in mounts if m["name"] == job_spec.POD_RESOURCES_VOLUME)
    return m


def _mount_pod_resources(job: Obj, pod: Obj, container: Obj) -> None:
    """Give a Job the kubelet's pod-resources directory as a partition Job has it."""
    partition = _own_pod("partition")
    pod["volumes"].append(
        next(v for v in partition["volumes"] if v["name"] == job_spec.POD_RESOURCES_VOLUME)
    )
    container["volumeMounts"].append(_pod_resources_mount(partition["containers"][0]))


def _move_pod_resources(pod: Obj, container: Obj, path: str) -> None:
    """The pod-resources volume, read-only still, at another host path (and mounted there)."""
    (v,) = (v for v in pod["volumes"] if v["name"] == job_spec.POD_RESOURCES_VOLUME)
    v["hostPath"]["path"] = path
    _pod_resources_mount(container)["mountPath"] = path


def _own_pod(action: str) -> Obj:
    """The pod spec of the controller's own Job for ``action`` (no cluster needed)."""
    m = job_spec.manifest(job_spec.JobTemplate(image="x"), "node", action, 1)
    spec: Obj = m["spec"]["template"]["spec"]
    return spec


Request = tuple[str, str, Any] | tuple[str, str, Any, str]

_SHELL = ["nsenter", "--target", "1", "--all", "sh", "-c", "cat /etc/kubernetes/admin.conf"]
"""What a command run in the privileged, host-PID agent would do: enter the host."""


def _with_flag(flag: str) -> Callable[[Rig, Objects], Request]:
    """The request creating an agent Job whose agent gets ``flag`` too."""

    def request(r: Rig, o: Objects) -> Request:
        return ("POST", JOBS, tampered(r, lambda j, p, c: c["args"].append(flag)))

    return request


def _with_container_field(field: Obj) -> Callable[[Rig, Objects], Request]:
    """The request creating an agent Job whose container also has ``field``."""

    def request(r: Rig, o: Objects) -> Request:
        return ("POST", JOBS, tampered(r, lambda j, p, c: c.update(field)))

    return request


def _issue_34_escape(job: Obj, pod: Obj, container: Obj) -> None:
    """Issue 34's finding: a kube-system Job under an account that may escalate ClusterRoles,
    privileged, with the host's root mounted and a shell of its own."""
    pod["serviceAccountName"] = "clusterrole-aggregation-controller"
    pod["automountServiceAccountToken"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    container["volumeMounts"].append({"name": "host", "mountPath": "/host"})
    container["securityContext"] = {"privileged": True}
    container["command"] = _SHELL


@dataclass(frozen=True)
class Attack:
    id: str
    component: str
    request: Callable[[Rig, Objects], Request]
    refused_by: str
    """RBAC, or a fragment of the admission policy's message."""
    token: str = "bound"
    """Which of the account's tokens: bound to its pod on a node, or unbound."""
    also_by: tuple[str, ...] = ()
    """Fragments of other policies that refuse it too: the apiserver reports whichever of them
    it evaluated first, and that order is not fixed."""


def _pods(rig: Rig, name: str, ns: str | None = None) -> str:
    return f"/api/v1/namespaces/{ns or rig.victims}/pods/{name}"


def _claims(rig: Rig) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{rig.victims}/resourceclaims"


def _claim(name: str, owner: Obj | None) -> Obj:
    """A claim for one GPU share; ``owner``: the pod it is made for, as the scheduler makes it
    on a node in DRA mode (docs/dra.md)."""
    meta: Obj = {"name": name}
    if owner is not None:
        meta["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    request = {"deviceClassName": "gpu-share.lj-runtimekit.aliyun.com", "count": 1}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": request}]}},
    }


def _node(name: str) -> str:
    return f"/api/v1/nodes/{name}"


SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _slice(name: str, node: str | None) -> dict[str, object]:
    """A ResourceSlice of the suite's driver with one device, on ``node`` (None: all nodes)."""
    where: dict[str, object] = {"nodeName": node} if node else {"allNodes": True}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "lj-runtimekit.aliyun.com",
            "pool": {"name": node or "all", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
            **where,
        },
    }


PLUGIN = "lj-runtimekit-device-plugin"


def _events(rig: Rig) -> str:
    return f"/api/v1/namespaces/{rig.victims}/events"


def _plugin_event(rig: Rig, pod: str, node: str | None = None, **change: Any) -> Obj:
    """An Event about ``pod`` as the plugin's ``kube.post_event`` writes it, reported by the
    plugin of ``node`` (default: the attacker's own), with the top-level fields ``change``."""
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod}.", "namespace": rig.victims},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": rig.victims,
            "name": pod,
        },
        "reason": "GpuAssignmentRefused",
        "message": "security test",
        "type": "Warning",
        "source": {"component": PLUGIN, "host": node or rig.own_node},
        "reportingComponent": PLUGIN,
        "reportingInstance": node or rig.own_node,
    }
    body.update(change)
    return body


LABEL = "lj-runtimekit.aliyun.com/sec-test"
DP_ANN = "lj-runtimekit-device-plugin/allocated"
CTL_ANN = "lj-runtimekit-controller/last-action-status"
SCHED_ANN = "lj-runtimekit-scheduler/gpu-assignment"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
CRB = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
ND = "/apis/lj-runtimekit.aliyun.com/v1/nodedevices"


def _binding(pod: str, node: str, annotations: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def _escalate(account: str) -> Obj:
    return {
        "metadata": {"name": f"sec-escalate-{uuid.uuid4().hex[:6]}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NS}],
    }


def _running(rig: Rig, path: str) -> None:
    """Until the pod at ``path`` runs (its node has written the status it keeps)."""
    eventually(
        f"{path} running",
        lambda: ok(rig.root("GET", path, None), path).get("status", {}).get("phase") == "Running",
    )


def _preempted_condition() -> Obj:
    """The condition kube-scheduler (and ours, ``kube.preempt``) sets on a pod it preempts. Its
    transition time is now: the disruption controller turns a DisruptionTarget condition older
    than two minutes on a pod not being deleted back to False (one without a time at once)."""
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "lj-runtimekit-scheduler: preempting to accommodate a higher priority pod",
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _mark(rig: Rig, path: str) -> None:
    """Mark the pod at ``path`` preempted, as another scheduler would (root's write)."""
    marked = {"status": {"conditions": [_preempted_condition()]}}
    ok(rig.root("PATCH", f"{path}/status", marked, patch="strategic"), f"mark {path}")


def _delete_marked(rig: Rig, path: str) -> Request:
    """The deletion of the pod at ``path`` just after it was marked (a fresh mark: an old one
    the disruption controller may have turned back to False)."""
    _mark(rig, path)
    return ("DELETE", path, None)


def _lease(name: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"holderIdentity": "attacker"}}


def _image(pod: str = "evil:latest") -> Obj:
    return {"spec": {"containers": [{"name": "main", "image": pod}]}}


def _common(component: str, account: str, delete_refused_by: str = RBAC) -> list[Attack]:
    """What no component may do at all (``delete_refused_by``: the scheduler may delete the pods
    it preempts, so its admission policy, not RBAC, refuses every other pod deletion)."""
    return [
        Attack(
            f"{component}-read-secrets",
            component,
            lambda r, o: ("GET", f"/api/v1/namespaces/{NS}/secrets", None),
            RBAC,
        ),
        Attack(
            f"{component}-create-pod",
            component,
            lambda r, o: (
                "POST",
                f"/api/v1/namespaces/{r.victims}/pods",
                pod_body("evil", r.own_node),
            ),
            RBAC,
        ),
        Attack(
            f"{component}-exec-into-pod",
            component,
            lambda r, o: ("POST", f"{_pods(r, o.tenant)}/exec?command=sh&stdout=true", None),
            RBAC,
        ),
        Attack(
            f"{component}-delete-pod",
            component,
            lambda r, o: ("DELETE", _pods(r, o.tenant), None),
            delete_refused_by,
        ),
        Attack(
            f"{component}-bind-cluster-admin",
            component,
            lambda r, o: ("POST", CRB, _escalate(account)),
            RBAC,
        ),
        Attack(
            f"{component}-escalate-own-role",
            component,
            lambda r, o: (
                "PATCH",
                f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{account}",
                {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
            ),
            RBAC,
        ),
        Attack(
            f"{component}-patch-node-status",
            component,
            lambda r, o: (
                "PATCH",
                f"{_node(r.own_node)}/status",
                {"status": {"capacity": {"aliyun.com/gpu": "99"}}},
            ),
            RBAC,
        ),
        Attack(
            f"{component}-create-daemonset",
            component,
            lambda r, o: (
                "POST",
                f"/apis/apps/v1/namespaces/{NS}/daemonsets",
                {"metadata": {"name": "evil"}},
            ),
            RBAC,
        ),
        Attack(
            f"{component}-delete-nodedevices",
            component,
            lambda r, o: ("DELETE", f"{ND}/{r.other_node}", None),
            RBAC,
        ),
        Attack(
            f"{component}-take-another-lease",
            component,
            lambda r, o: (
                "PUT",
                f"{LEASES}/kube-controller-manager",
                _lease("kube-controller-manager"),
            ),
            RBAC,
        ),
    ]


ATTACKS: list[Attack] = [
    # --- the scheduler: it binds and posts Events; it never edits a pod but its status for a
    # claim or a preemption, and deletes only the pods it preempts
    *_common("scheduler", "lj-runtimekit-scheduler", delete_refused_by=PREEMPTS_ONLY),
    Attack(
        "scheduler-delete-pending-pod",
        "scheduler",
        lambda r, o: ("DELETE", _pods(r, o.pending), None),
        PREEMPTS_ONLY,
    ),
    Attack(
        "scheduler-delete-marked-system-critical-pod",
        "scheduler",
        lambda r, o: _delete_marked(r, _pods(r, o.critical, NS)),
        PREEMPTS_ONLY,
    ),
    Attack(
        "scheduler-mark-system-critical-pod",
        "scheduler",
        lambda r, o: (
            "PATCH",
            f"{_pods(r, o.critical, NS)}/status",
            {"status": {"conditions": [_preempted_condition()]}},
            "strategic",
        ),
        "may only set the extendedResourceClaimStatus",
    ),
    Attack(
        "scheduler-mark-and-fail-a-pod",
        "scheduler",
        lambda r, o: (
            "PATCH",
            f"{_pods(r, o.tenant)}/status",
            {"status": {"phase": "Failed", "conditions": [_preempted_condition()]}},
            "strategic",
        ),
        "may only set the extendedResourceClaimStatus",
    ),
    Attack(
        "scheduler-mark-a-pending-pod",
        "scheduler",
        lambda r, o: (
            "PATCH",
            f"{_pods(r, o.pending)}/status",
            {"status": {"conditions": [_preempted_condition()]}},
            "strategic",
        ),
        "may only set the extendedResourceClaimStatus",
    ),
    Attack(
        "scheduler-nominate-a-pod-not-its-own",
        "scheduler",
        lambda r, o: (
            "PATCH",
            f"{_pods(r, o.stranger)}/status",
            {"status": {"nominatedNodeName": r.other_node}},
        ),
        "may only set the extendedResourceClaimStatus",
    ),
    Attack(
        "scheduler-replace-image",
        "scheduler",
        lambda r, o: ("PATCH", _pods(r, o.tenant), _image(), "strategic"),
        RBAC,
    ),
    Attack(
        "scheduler-patch-pod-status",
        "scheduler",
        lambda r, o: ("PATCH", f"{_pods(r, o.tenant)}/status", {"status": {"phase": "Failed"}}),
        "may only set the extendedResourceClaimStatus",
    ),
    Attack(
        "scheduler-fail-its-own-pod",
        "scheduler",
        lambda r, o: ("PATCH", f"{_pods(r, o.pending)}/status", {"status": {"phase": "Failed"}}),
        "may only set the extendedResourceClaimStatus",
    ),
    Attack(
        "scheduler-create-a-claim-of-its-own",
        "scheduler",
        lambda r, o: ("POST", _claims(r), _claim("free-gpus", None)),
        "may only create, allocate and delete the claims it makes",
    ),
    Attack(
        "scheduler-annotate-pod",
        "scheduler",
        lambda r, o: (
            "PATCH",
            _pods(r, o.pending),
            {"metadata": {"annotations": {SCHED_ANN: "{}"}}},
        ),
        RBAC,
    ),
    Attack(
        "scheduler-binding-carries-foreign-annotation",
        "scheduler",
        lambda r, o: (
            "POST",
            f"{_pods(r, o.pending)}/binding",
            _binding(o.pending, r.own_node, {"evil/key": "x"}),
        ),
        "may only carry the annotation",
    ),
    Attack(
        "scheduler-binding-carries-device-plugin-mark",
        "scheduler",
        lambda r, o: (
            "POST",
            f"{_pods(r, o.pending)}/binding",
            _binding(o.pending, r.own_node, {SCHED_ANN: "{}", DP_ANN: "forged"}),
        ),
        "may only carry the annotation",
    ),
    Attack(
        "scheduler-cordon-node",
        "scheduler",
        lambda r, o: ("PATCH", _node(r.own_node), {"spec": {"unschedulable": True}}),
        RBAC,
    ),
    Attack(
        "scheduler-renew-controller-lease",
        "scheduler",
        lambda r, o: (
            "PUT",
            f"{LEASES}/lj-runtimekit-controller",
            _lease("lj-runtimekit-controller"),
        ),
        RBAC,
    ),
    Attack(
        "scheduler-squat-controller-lease",
        "scheduler",
        lambda r, o: ("POST", LEASES, _lease("lj-runtimekit-controller")),
        "own Lease lj-runtimekit-scheduler",
    ),
    Attack(
        "scheduler-write-nodedevices",
        "scheduler",
        lambda r, o: (
            "POST",
            ND,
            {
                "apiVersion": "lj-runtimekit.aliyun.com/v1",
                "kind": "NodeDevices",
                "metadata": {"name": "forged"},
                "spec": {"nodeName": "forged"},
            },
        ),
        RBAC,
    ),
    Attack("scheduler-create-job", "scheduler", lambda r, o: ("POST", JOBS, agent_job(r)), RBAC),
    # --- its volume rights: bind a PV that names no claim, select a claim's node; nothing more
    Attack(
        "scheduler-rebind-a-bound-pv",
        "scheduler",
        lambda r, o: (
            "PUT",
            f"{PVS}/{o.bound_pv}",
            _changed(
                r,
                f"{PVS}/{o.bound_pv}",
                lambda pv: pv["spec"].update(claimRef={"namespace": NS, "name": "stolen"}),
            ),
        ),
        "may only bind a PersistentVolume that names no claim yet",
    ),
    Attack(
        "scheduler-bind-a-pv-and-make-it-delete",
        "scheduler",
        lambda r, o: (
            "PUT",
            f"{PVS}/{o.free_pv}",
            _changed(
                r,
                f"{PVS}/{o.free_pv}",
                lambda pv: pv["spec"].update(
                    claimRef={"namespace": r.victims, "name": o.claim},
                    persistentVolumeReclaimPolicy="Delete",
                ),
            ),
        ),
        "may only bind a PersistentVolume that names no claim yet",
    ),
    Attack(
        "scheduler-drop-a-claim-s-protection",
        "scheduler",
        lambda r, o: (
            "PUT",
            f"{_claims_path(r)}/{o.claim}",
            _changed(
                r,
                f"{_claims_path(r)}/{o.claim}",
                lambda c: c["metadata"].update(finalizers=[]),
            ),
        ),
        "may only add the annotation volume.kubernetes.io/selected-node",
    ),
    Attack(
        "scheduler-label-a-claim",
        "scheduler",
        lambda r, o: (
            "PUT",
            f"{_claims_path(r)}/{o.claim}",
            _changed(
                r,
                f"{_claims_path(r)}/{o.claim}",
                lambda c: c["metadata"].setdefault("labels", {}).update(evil="x"),
            ),
        ),
        "may only add the annotation volume.kubernetes.io/selected-node",
    ),
    Attack(
        "scheduler-delete-a-pv",
        "scheduler",
        lambda r, o: ("DELETE", f"{PVS}/{o.bound_pv}", None),
        RBAC,
    ),
    Attack(
        "scheduler-patch-a-pv",
        "scheduler",
        lambda r, o: (
            "PATCH",
            f"{PVS}/{o.free_pv}",
            {"spec": {"persistentVolumeReclaimPolicy": "Delete"}},
        ),
        RBAC,
    ),
    Attack(
        "scheduler-create-a-pv",
        "scheduler",
        lambda r, o: ("POST", PVS, _pv(f"x-{o.free_pv}")),
        RBAC,
    ),
    Attack(
        "scheduler-delete-a-claim",
        "scheduler",
        lambda r, o: ("DELETE", f"{_claims_path(r)}/{o.claim}", None),
        RBAC,
    ),
    # --- the controller: agent Jobs from the pinned template, its own node annotations
    *_common("controller", "lj-runtimekit-controller"),
    Attack(
        "controller-job-not-an-agent-image",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: c.update(image="evil.example/busybox:1")),
        ),
        "runs a lj-runtimekit-controller-job-agent image",
        also_by=("the job-agent image the controller Deployment names",),
    ),
    Attack(
        "controller-job-other-image",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r, lambda j, p, c: c.update(image="evil/lj-runtimekit-controller-job-agent:v1.13.0")
            ),
        ),
        "job-agent image the controller Deployment names",
    ),
    Attack(
        "controller-job-kube-system-account",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r, lambda j, p, c: p.update(serviceAccountName="clusterrole-aggregation-controller")
            ),
        ),
        "runs as ServiceAccount lj-runtimekit-job-agent",
    ),
    Attack(
        "controller-job-with-token",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: p.update(automountServiceAccountToken=True)),
        ),
        "runs as ServiceAccount lj-runtimekit-job-agent",
    ),
    Attack(
        "controller-job-host-root",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r,
                lambda j, p, c: p["volumes"].__setitem__(
                    0, {"name": "containerd", "hostPath": {"path": "/"}}
                ),
            ),
        ),
        "mounts only",
    ),
    Attack(
        "controller-job-extra-volume",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r, lambda j, p, c: p["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
            ),
        ),
        "mounts only",
    ),
    Attack(
        "controller-job-enable-reads-pod-resources",
        "controller",
        lambda r, o: ("POST", JOBS, tampered(r, _mount_pod_resources)),
        "mounts only",
    ),
    Attack(
        "controller-job-pod-resources-writable",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: _pod_resources_mount(c).pop("readOnly"), "partition"),
        ),
        "mounts only",
    ),
    Attack(
        "controller-job-pod-resources-kubelet-dir",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: _move_pod_resources(p, c, "/var/lib/kubelet"), "partition"),
        ),
        "mounts only",
    ),
    Attack(
        "controller-job-own-command",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: c.update(command=["sh", "-c", "id"])),
        ),
        "own entrypoint",
    ),
    Attack(
        "controller-job-other-action",
        "controller",
        lambda r, o: ("POST", JOBS, tampered(r, lambda j, p, c: c["args"].__setitem__(0, "shell"))),
        "own entrypoint",
    ),
    Attack(
        "controller-job-other-node-arg",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: c["args"].__setitem__(1, f"--node-name={r.other_node}")),
        ),
        "own entrypoint",
    ),
    Attack(
        "controller-job-any-node",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: p.update(nodeName=None, affinity={})),
        ),
        "exactly",
    ),
    Attack(
        "controller-job-host-network",
        "controller",
        lambda r, o: ("POST", JOBS, tampered(r, lambda j, p, c: p.update(hostNetwork=True))),
        "no host network",
    ),
    Attack(
        "controller-job-init-container",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r,
                lambda j, p, c: p.update(
                    initContainers=[
                        {"name": "x", "image": "evil", "securityContext": {"privileged": True}}
                    ]
                ),
            ),
        ),
        "one container",
    ),
    Attack(
        "controller-job-second-container",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r, lambda j, p, c: p["containers"].append({**c, "name": "evil", "image": "evil"})
            ),
        ),
        "one container",
    ),
    Attack(
        "controller-job-in-default",
        "controller",
        lambda r, o: ("POST", "/apis/batch/v1/namespaces/default/jobs", agent_job(r)),
        RBAC,
    ),
    # Issue 34 §1: the issue's escape whole (a kube-system account that escalates ClusterRoles,
    # privileged, the host's root mounted), and the ways to run a command in the privileged
    # agent that a pinned image and entrypoint left open.
    Attack(
        "controller-job-issue-34-privileged-kube-system-escape",
        "controller",
        lambda r, o: ("POST", JOBS, tampered(r, _issue_34_escape)),
        "runs as ServiceAccount lj-runtimekit-job-agent",
        also_by=("mounts only", "own entrypoint"),
    ),
    *(
        Attack(
            f"controller-job-flag-{name}",
            "controller",
            _with_flag(flag),
            "own entrypoint",
        )
        for name, flag in (
            ("restart-command", "--restart-command=nsenter -t 1 -a sh -c id"),
            ("confirm-command", "--confirm-command=nsenter -t 1 -a sh -c id"),
            ("abbreviated-restart-command", "--restart-com=sh -c id"),
            ("host-root", "--host-root=/proc/1/root"),
            ("containerd-config-elsewhere", "--containerd-config=/proc/1/root/etc/shadow"),
            ("containerd-socket-elsewhere", "--containerd-socket=/proc/1/root/run/k3s.sock"),
            ("restart-marker-elsewhere", "--restart-marker=/proc/1/root/etc/cron.d/x"),
            ("config-file", "--config=/proc/1/root/etc/kubernetes/admin.conf"),
            ("second-node-name", "--node-name=another-node"),
            ("other-socket-dir", "--socket-dir=/proc/1/root"),
        )
    ),
    Attack(
        "controller-job-pod-resources-socket-elsewhere",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r,
                lambda j, p, c: c["args"].append("--pod-resources-socket=/proc/1/root/x.sock"),
                "partition",
            ),
        ),
        "own entrypoint",
    ),
    *(
        Attack(
            f"controller-job-{name}",
            "controller",
            _with_container_field(field),
            "no lifecycle hooks, probes or mount propagation",
        )
        for name, field in (
            ("post-start-hook", {"lifecycle": {"postStart": {"exec": {"command": _SHELL}}}}),
            ("pre-stop-hook", {"lifecycle": {"preStop": {"exec": {"command": _SHELL}}}}),
            ("liveness-probe", {"livenessProbe": {"exec": {"command": _SHELL}}}),
            ("readiness-probe", {"readinessProbe": {"exec": {"command": _SHELL}}}),
            ("startup-probe", {"startupProbe": {"exec": {"command": _SHELL}}}),
        )
    ),
    Attack(
        "controller-job-bidirectional-mount",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(
                r, lambda j, p, c: c["volumeMounts"][0].update(mountPropagation="Bidirectional")
            ),
        ),
        "no lifecycle hooks, probes or mount propagation",
    ),
    Attack(
        "controller-job-many-pods",
        "controller",
        lambda r, o: (
            "POST",
            JOBS,
            tampered(r, lambda j, p, c: j["spec"].update(parallelism=50, completions=50)),
        ),
        "one pod at a time",
    ),
    Attack(
        "controller-delete-foreign-job",
        "controller",
        lambda r, o: ("DELETE", f"{JOBS}/{o.foreign_job}", None),
        "delete its own agent Jobs",
    ),
    Attack(
        "controller-patch-job",
        "controller",
        lambda r, o: ("PATCH", f"{JOBS}/{o.foreign_job}", {"spec": {"suspend": False}}),
        RBAC,
    ),
    Attack(
        "controller-cordon-node",
        "controller",
        lambda r, o: ("PATCH", _node(r.own_node), {"spec": {"unschedulable": True}}),
        "never its spec (cordon, taints)",
    ),
    Attack(
        "controller-taint-node",
        "controller",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}},
        ),
        "never its spec (cordon, taints)",
    ),
    Attack(
        "controller-label-node",
        "controller",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"metadata": {"labels": {"lj_runtimekit_enable": "false"}}},
        ),
        "never its spec (cordon, taints)",
    ),
    Attack(
        "controller-foreign-node-annotation",
        "controller",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"metadata": {"annotations": {"evil.example/owner": "attacker"}}},
        ),
        "never its spec (cordon, taints)",
    ),
    Attack(
        "controller-delete-node",
        "controller",
        lambda r, o: ("DELETE", _node(r.other_node), None),
        RBAC,
    ),
    Attack(
        "controller-squat-scheduler-lease",
        "controller",
        lambda r, o: ("POST", LEASES, _lease("lj-runtimekit-scheduler")),
        "own Lease lj-runtimekit-controller",
    ),
    Attack(
        "controller-read-pod", "controller", lambda r, o: ("GET", _pods(r, o.tenant), None), RBAC
    ),
    # --- the device plugin: its own node's device labels, its pods' allocation marks
    *_common("device-plugin", "lj-runtimekit-device-plugin"),
    Attack(
        "device-plugin-node-restriction-label",
        "device-plugin",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"metadata": {"labels": {"node-restriction.kubernetes.io/gpu": "x"}}},
        ),
        "may only change its own labels",
    ),
    Attack(
        "device-plugin-foreign-label",
        "device-plugin",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"metadata": {"labels": {"lj_runtimekit_enable": "false"}}},
        ),
        "may only change its own labels",
    ),
    Attack(
        "device-plugin-node-annotation",
        "device-plugin",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"metadata": {"annotations": {CTL_ANN: "forged"}}},
        ),
        "may only change its own labels",
    ),
    Attack(
        "device-plugin-resourceslice-of-another-node",
        "device-plugin",
        lambda r, o: ("POST", SLICES, _slice(f"sec-other-{r.other_node}", r.other_node)),
        "may only write its own node, its NodeDevices, the ResourceSlices of its node",
    ),
    Attack(
        "device-plugin-resourceslice-for-all-nodes",
        "device-plugin",
        lambda r, o: ("POST", SLICES, _slice("sec-all-nodes", None)),
        "may only write its own node, its NodeDevices, the ResourceSlices of its node",
    ),
    Attack(
        "device-plugin-cordon-own-node",
        "device-plugin",
        lambda r, o: ("PATCH", _node(r.own_node), {"spec": {"unschedulable": True}}),
        "may only change its own labels",
    ),
    Attack(
        "device-plugin-taint-own-node",
        "device-plugin",
        lambda r, o: (
            "PATCH",
            _node(r.own_node),
            {"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}},
        ),
        "may only change its own labels",
    ),
    Attack(
        "device-plugin-label-other-node",
        "device-plugin",
        lambda r, o: ("PATCH", _node(r.other_node), {"metadata": {"labels": {LABEL: "x"}}}),
        "may only write its own node",
    ),
    Attack(
        "device-plugin-replace-image-on-own-node",
        "device-plugin",
        lambda r, o: ("PATCH", _pods(r, o.tenant), _image(), "strategic"),
        "never its spec, image",
    ),
    Attack(
        "device-plugin-relabel-pod",
        "device-plugin",
        lambda r, o: ("PATCH", _pods(r, o.tenant), {"metadata": {"labels": {"app": "evil"}}}),
        "never its spec, image",
    ),
    Attack(
        "device-plugin-forge-scheduler-decision",
        "device-plugin",
        lambda r, o: (
            "PATCH",
            _pods(r, o.tenant),
            {"metadata": {"annotations": {SCHED_ANN: "forged"}}},
        ),
        "never its spec, image",
    ),
    Attack(
        "device-plugin-mark-pod-elsewhere",
        "device-plugin",
        lambda r, o: ("PATCH", _pods(r, o.elsewhere), {"metadata": {"annotations": {DP_ANN: "x"}}}),
        "may only write its own node",
    ),
    Attack(
        "device-plugin-patch-pod-status",
        "device-plugin",
        lambda r, o: ("PATCH", f"{_pods(r, o.tenant)}/status", {"status": {"phase": "Failed"}}),
        RBAC,
    ),
    Attack(
        "device-plugin-other-nodedevices",
        "device-plugin",
        lambda r, o: (
            "POST",
            ND,
            {
                "apiVersion": "lj-runtimekit.aliyun.com/v1",
                "kind": "NodeDevices",
                "metadata": {"name": r.other_node},
                "spec": {"nodeName": r.other_node},
            },
        ),
        "may only write its own node",
    ),
    Attack(
        "device-plugin-own-name-other-node",
        "device-plugin",
        lambda r, o: (
            "POST",
            ND,
            {
                "apiVersion": "lj-runtimekit.aliyun.com/v1",
                "kind": "NodeDevices",
                "metadata": {"name": r.own_node},
                "spec": {"nodeName": r.other_node},
            },
        ),
        "deletes none",
    ),
    Attack(
        "device-plugin-read-pods-of-the-cluster",
        "device-plugin",
        lambda r, o: ("GET", f"/api/v1/namespaces/{r.victims}/pods/{o.tenant}/log", None),
        RBAC,
    ),
    # Events: CEL cannot read the pod an Event names, so the fence is on what the Event says of
    # its reporter (docs/security.md): the plugin of this node, and no one else.
    Attack(
        "device-plugin-event-as-another-nodes-plugin",
        "device-plugin",
        lambda r, o: ("POST", _events(r), _plugin_event(r, o.elsewhere, r.other_node)),
        "may only post Events about pods that name it as their reporter",
    ),
    Attack(
        "device-plugin-event-as-the-kubelet",
        "device-plugin",
        lambda r, o: (
            "POST",
            _events(r),
            _plugin_event(
                r,
                o.tenant,
                source={"component": "kubelet", "host": r.own_node},
                reportingComponent="kubelet",
                reason="Killing",
            ),
        ),
        "may only post Events about pods that name it as their reporter",
    ),
    Attack(
        "device-plugin-event-without-its-reporter",
        "device-plugin",
        lambda r, o: (
            "POST",
            _events(r),
            {
                k: v
                for k, v in _plugin_event(r, o.tenant).items()
                if k not in ("source", "reportingComponent", "reportingInstance")
            },
        ),
        "may only post Events about pods that name it as their reporter",
    ),
    Attack(
        "device-plugin-event-about-a-node",
        "device-plugin",
        lambda r, o: (
            "POST",
            "/api/v1/namespaces/default/events",
            _plugin_event(
                r,
                o.tenant,
                metadata={"generateName": f"{r.own_node}.", "namespace": "default"},
                involvedObject={"apiVersion": "v1", "kind": "Node", "name": r.own_node},
            ),
        ),
        "may only post Events about pods that name it as their reporter",
    ),
    Attack(
        "device-plugin-event-with-a-related-object",
        "device-plugin",
        lambda r, o: (
            "POST",
            _events(r),
            _plugin_event(
                r,
                o.tenant,
                related={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": r.victims,
                    "name": o.elsewhere,
                },
            ),
        ),
        "may only post Events about pods that name it as their reporter",
    ),
    Attack(
        "device-plugin-unbound-token-posts-event",
        "device-plugin",
        lambda r, o: ("POST", _events(r), _plugin_event(r, o.tenant)),
        "bound to its pod on a node",
        token="unbound",
    ),
    Attack(
        "device-plugin-unbound-token-labels-node",
        "device-plugin",
        lambda r, o: ("PATCH", _node(r.own_node), {"metadata": {"labels": {LABEL: "x"}}}),
        "bound to its pod on a node",
        token="unbound",
    ),
    # --- the exporter reads pods; the job agent has no rights at all
    *_common("exporter", "lj-runtimekit-exporter"),
    Attack("exporter-get-node", "exporter", lambda r, o: ("GET", _node(r.own_node), None), RBAC),
    Attack(
        "exporter-annotate-pod",
        "exporter",
        lambda r, o: ("PATCH", _pods(r, o.tenant), {"metadata": {"annotations": {"x": "y"}}}),
        RBAC,
    ),
    *_common("job-agent", "lj-runtimekit-job-agent"),
    Attack("job-agent-list-pods", "job-agent", lambda r, o: ("GET", "/api/v1/pods", None), RBAC),
    Attack("job-agent-get-node", "job-agent", lambda r, o: ("GET", _node(r.own_node), None), RBAC),
]


def _send(rig: Rig, a: Attack, o: Objects) -> Reply:
    tokens = rig.tokens if a.token == "bound" else rig.unbound_tokens
    method, path, body, *patch = a.request(rig, o)
    return rig.caller(tokens[a.component])(method, path, body, patch=patch[0] if patch else "merge")


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_escape_is_refused(rig: Rig, objs: Objects, attack: Attack) -> None:
    got = _send(rig, attack, objs)
    if attack.refused_by == RBAC:
        assert got.status == 403, (got.status, got.message)
        assert f"system:serviceaccount:{NS}:" in got.message, got.message
        assert "ValidatingAdmissionPolicy" not in got.message, got.message
    else:
        assert got.status in (403, 422), (got.status, got.message)
        assert "ValidatingAdmissionPolicy" in got.message, got.message
        assert any(m in got.message for m in (attack.refused_by, *attack.also_by)), got.message
        assert "resulted in error" not in got.message, got.message


@pytest.mark.xfail(
    strict=True,
    reason="known limit (docs/security.md): a ValidatingAdmissionPolicy cannot read the pod an "
    "Event names, so the device plugin's token may still post an Event about a pod of another "
    "node; the policy only makes it name the node whose plugin posted it",
)
def test_device_plugin_cannot_post_events_about_pods_of_other_nodes(
    rig: Rig, objs: Objects
) -> None:
    got = rig.as_("device-plugin")("POST", _events(rig), _plugin_event(rig, objs.elsewhere))
    assert got.status in (403, 422), "an Event about another node's pod, reported as its own"


def test_every_component_and_issue_escape_is_attacked() -> None:
    """The issue's own escapes are in the table (a renamed case must not drop one)."""
    ids = {a.id for a in ATTACKS}
    for named in (
        "scheduler-replace-image",
        "scheduler-delete-pod",
        "scheduler-delete-marked-system-critical-pod",
        "controller-job-kube-system-account",
        "controller-job-host-root",
        "controller-job-issue-34-privileged-kube-system-escape",
        "controller-job-flag-restart-command",
        "controller-job-post-start-hook",
        "controller-cordon-node",
        "controller-taint-node",
        "device-plugin-node-restriction-label",
        "device-plugin-cordon-own-node",
        "device-plugin-replace-image-on-own-node",
    ):
        assert named in ids
    assert {a.component for a in ATTACKS} == {
        "scheduler",
        "controller",
        "device-plugin",
        "exporter",
        "job-agent",
    }


def _ok(got: Reply, what: str) -> Reply:
    assert 200 <= got.status < 300, f"{what}: {got.status} {got.message}"
    return got


def test_scheduler_token_does_all_the_scheduler_does(rig: Rig, objs: Objects) -> None:
    s = rig.as_("scheduler")
    # pods, nodes, its inventory; namespaces (namespaceSelector) and the selectors of Services
    # and pod controllers (default topology spread constraints, issue 35)
    read = (
        "/api/v1/pods",
        "/api/v1/nodes",
        ND,
        "/api/v1/namespaces",
        "/api/v1/services",
        "/api/v1/replicationcontrollers",
        "/apis/apps/v1/replicasets",
        "/apis/apps/v1/statefulsets",
    )
    for path in read:
        _ok(s("GET", path, None, query=[("limit", 1)]), f"list {path}")
        _ok(s("GET", path, None, query=[("watch", "true"), ("timeoutSeconds", 1)]), "watch")
    decision = '{"version":"v1"}'
    _ok(
        s(
            "POST",
            f"{_pods(rig, objs.pending)}/binding",
            _binding(objs.pending, rig.own_node, {SCHED_ANN: decision}),
        ),
        "bind with its decision",
    )
    pod = ok(rig.root("GET", _pods(rig, objs.pending), None), "the bound pod")
    assert pod["spec"]["nodeName"] == rig.own_node
    assert pod["metadata"]["annotations"][SCHED_ANN] == decision
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{objs.pending}.sec", "namespace": rig.victims},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "type": "Normal",
        "reason": "Scheduled",
        "note": "security test",
        "action": "Scheduling",
        "reportingController": "lj-runtimekit-scheduler",
        "reportingInstance": "sec",
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": objs.pending,
            "namespace": rig.victims,
        },
    }
    events = f"/apis/events.k8s.io/v1/namespaces/{rig.victims}/events"
    _ok(s("POST", events, event), "event")
    series = {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:05.000000Z"}}
    _ok(s("PATCH", f"{events}/{objs.pending}.sec", series), "raise an aggregated Event's count")
    rewrite = s("PATCH", f"{events}/{objs.pending}.sec", {"note": "something else"})
    assert rewrite.status in (403, 422), (rewrite.status, rewrite.message)
    # events.k8s.io/v1 itself keeps what an Event says immutable: no policy is needed for it
    assert "field is immutable" in rewrite.message, rewrite.message
    _lease_cycle(rig, "scheduler", "lj-runtimekit-scheduler")
    _claim_cycle(rig)
    _preemption_cycle(rig)
    _volume_cycle(rig)
    _pod_group_cycle(rig)


def _pod_group_cycle(rig: Rig) -> None:
    """What the scheduler reads and writes for upstream PodGroups (``feed.py``,
    ``kube.pod_group_condition``): list and watch them, set their PodGroupInitiallyScheduled."""
    s = rig.as_("scheduler")
    groups = "/apis/scheduling.k8s.io/v1beta1/podgroups"
    _ok(s("GET", groups, None, query=[("limit", 1)]), "list PodGroups")
    _ok(s("GET", groups, None, query=[("watch", "true"), ("timeoutSeconds", 1)]), "watch them")
    name = f"gang-{uuid.uuid4().hex[:6]}"
    path = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{rig.victims}/podgroups"
    body = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    ok(rig.root("POST", path, body), "a PodGroup")
    condition = {
        "type": "PodGroupInitiallyScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "security test",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    mark = {"status": {"conditions": [condition]}}
    _ok(s("PATCH", f"{path}/{name}/status", mark, patch="strategic"), "its condition")
    spec = {"spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}
    changed = s("PATCH", f"{path}/{name}", spec)
    assert changed.status == 403, (changed.status, changed.message)  # its spec is not ours
    rig.root("DELETE", f"{path}/{name}", None)


def _preemption_cycle(rig: Rig) -> None:
    """What the scheduler writes to preempt (``kube.nominate``, ``kube.preempt``): PDBs read, the
    preemptor's nominatedNodeName set and cleared, the victim marked, then deleted."""
    s = rig.as_("scheduler")
    pdbs = "/apis/policy/v1/poddisruptionbudgets"
    _ok(s("GET", pdbs, None, query=[("limit", 1)]), "list PodDisruptionBudgets")
    _ok(s("GET", pdbs, None, query=[("watch", "true"), ("timeoutSeconds", 1)]), "watch them")
    run = uuid.uuid4().hex[:6]
    pods = f"/api/v1/namespaces/{rig.victims}/pods"
    preemptor = pod_body(f"preemptor-{run}", None, schedulerName="lj-runtimekit-scheduler")
    ok(rig.root("POST", pods, preemptor), "a pending pod of the scheduler")
    victim = ok(rig.root("POST", pods, pod_body(f"victim-{run}", rig.own_node)), "a victim")
    _running(rig, _pods(rig, f"victim-{run}"))  # a victim runs: its node writes no status after
    status = f"{_pods(rig, f'preemptor-{run}')}/status"
    for node in (rig.own_node, None):
        patch = {"status": {"nominatedNodeName": node}}
        _ok(s("PATCH", status, patch), f"nominatedNodeName {node}")
    vpath = _pods(rig, f"victim-{run}")
    mark = {"status": {"conditions": [_preempted_condition()]}}
    _ok(s("PATCH", f"{vpath}/status", mark, patch="strategic"), "mark the victim preempted")
    conditions = ok(rig.root("GET", vpath, None), "the victim")["status"]["conditions"]
    assert [c["reason"] for c in conditions if c["type"] == "DisruptionTarget"] == [
        "PreemptionByScheduler"
    ]
    gone = {"preconditions": {"uid": victim["metadata"]["uid"]}}
    _ok(s("DELETE", vpath, gone), "delete the victim it marked")
    rig.root("DELETE", _pods(rig, f"preemptor-{run}"), {"gracePeriodSeconds": 0})


STORAGE_LISTS = (
    "/api/v1/persistentvolumeclaims",
    PVS,
    "/apis/storage.k8s.io/v1/storageclasses",
    "/apis/storage.k8s.io/v1/csinodes",
    "/apis/storage.k8s.io/v1/csidrivers",
    "/apis/storage.k8s.io/v1/csistoragecapacities",
)


def _volume_cycle(rig: Rig) -> None:
    """What VolumeBinding writes (plugins/volume_binding.py, kube.update_volume/update_claim):
    the claimRef of a PV that names no claim, and the selected node of a claim to provision."""
    s = rig.as_("scheduler")
    for path in STORAGE_LISTS:
        _ok(s("GET", path, None, query=[("limit", 1)]), f"list {path}")
        _ok(s("GET", path, None, query=[("watch", "true"), ("timeoutSeconds", 1)]), "watch")
    run = uuid.uuid4().hex[:6]
    pv, claim = f"sec-bind-{run}", f"bind-{run}"
    # of classes that do not match: the PV controller binds neither to the other (nor to
    # anything) before the scheduler's writes, which would race them
    made = ok(rig.root("POST", _claims_path(rig), _pvc(claim, "sec-cycle-claim")), "a claim")
    ok(rig.root("POST", PVS, _pv(pv, cls="sec-cycle-pv")), "a free PV")
    path = f"{_claims_path(rig)}/{claim}"
    try:
        eventually("the new PV Available", _phase(rig, f"{PVS}/{pv}", "Available"))

        def select(obj: Obj) -> None:
            ann = obj["metadata"].setdefault("annotations", {})
            ann["volume.kubernetes.io/selected-node"] = rig.own_node

        _ok(s("PUT", path, _changed(rig, path, select)), "select the claim's node")

        def bind(obj: Obj) -> None:
            obj["spec"]["claimRef"] = {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": rig.victims,
                "name": claim,
                "uid": made["metadata"]["uid"],
            }
            obj["metadata"].setdefault("annotations", {})[
                "pv.kubernetes.io/bound-by-controller"
            ] = "yes"

        _ok(s("PUT", f"{PVS}/{pv}", _changed(rig, f"{PVS}/{pv}", bind)), "bind the PV")
    finally:
        rig.root("DELETE", f"{PVS}/{pv}", None)
        rig.root("DELETE", f"{_claims_path(rig)}/{claim}", None)


def _claim_cycle(rig: Rig) -> None:
    """What the scheduler writes for a pod of its own on a node in DRA mode: the pod's claim,
    its allocation and reservation, the pod's extendedResourceClaimStatus; then the claim gone."""
    s = rig.as_("scheduler")
    for path in (
        "/apis/resource.k8s.io/v1/resourceslices",
        "/apis/resource.k8s.io/v1/resourceclaims",
    ):
        _ok(s("GET", path, None, query=[("limit", 1)]), f"list {path}")
    share = {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "10"}
    body = pod_body(f"share-{uuid.uuid4().hex[:6]}", None, schedulerName="lj-runtimekit-scheduler")
    body["spec"]["containers"][0]["resources"] = {"requests": share, "limits": share}
    pod = ok(rig.root("POST", f"/api/v1/namespaces/{rig.victims}/pods", body), "a share pod")
    name = pod["metadata"]["name"]
    claim = _ok(s("POST", _claims(rig), _claim(f"{name}-extended-resources", pod)), "claim").body
    path = f"{_claims(rig)}/{claim['metadata']['name']}"
    result = {
        "request": "container-0-request-0",
        "driver": "lj-runtimekit.aliyun.com",
        "pool": rig.own_node,
        "device": "gpu-0",
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"cores": "30", "memory": "10Gi"},
    }
    status = {
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [rig.own_node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
        }
    }
    _ok(s("PATCH", f"{path}/status", status), "allocate and reserve the claim")
    mapping = {
        "resourceClaimName": claim["metadata"]["name"],
        "requestMappings": [
            {"containerName": "main", "resourceName": r, "requestName": "container-0-request-0"}
            for r in share
        ],
    }
    patch = {"status": {"extendedResourceClaimStatus": mapping}}
    _ok(s("PATCH", f"{_pods(rig, name)}/status", patch), "the pod's extendedResourceClaimStatus")
    again = s("PATCH", f"{_pods(rig, name)}/status", patch)
    assert again.status in (403, 422), "the scheduler set a pod's extendedResourceClaimStatus twice"
    _ok(s("DELETE", path, None), "delete the claim")
    rig.root("DELETE", _pods(rig, name), None)


def _lease_cycle(rig: Rig, component: str, name: str) -> None:
    c = rig.as_(component)
    rig.root("DELETE", f"{LEASES}/{name}", None)
    created = _ok(c("POST", LEASES, _lease(name)), "create its Lease").body
    got = _ok(c("GET", f"{LEASES}/{name}", None), "get its Lease").body
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    got["spec"]["holderIdentity"] = "renewed"
    _ok(c("PUT", f"{LEASES}/{name}", got), "renew its Lease")
    rig.root("DELETE", f"{LEASES}/{name}", None)


def test_controller_token_does_all_the_controller_does(rig: Rig) -> None:
    c = rig.as_("controller")
    _ok(c("GET", "/api/v1/nodes", None), "list nodes")
    _ok(c("GET", "/api/v1/nodes", None, query=[("watch", "true"), ("timeoutSeconds", 1)]), "watch")
    _ok(
        c("PATCH", _node(rig.own_node), {"metadata": {"annotations": {CTL_ANN: '{"ok":true}'}}}),
        "annotate",
    )
    _ok(c("PATCH", _node(rig.own_node), {"metadata": {"annotations": {CTL_ANN: None}}}), "remove")
    for action in ("enable", "disable", "partition"):
        job = agent_job(rig, rig.own_node, action)
        volumes = {v["name"] for v in job["spec"]["template"]["spec"]["volumes"]}
        # a partition Job reads the kubelet's pod-resources directory; the others never do
        assert (job_spec.POD_RESOURCES_VOLUME in volumes) == (action == "partition"), volumes
        _ok(c("POST", JOBS, job), f"create the agent Job ({action})")
        _ok(c("GET", JOBS, None, query=[("labelSelector", "app=lj-runtimekit-job-agent")]), "list")
        q = [("labelSelector", f"job-name={job['metadata']['name']}")]
        _ok(c("GET", f"/api/v1/namespaces/{NS}/pods", None, query=q), "list its pods")
        _ok(
            c("DELETE", f"{JOBS}/{job['metadata']['name']}", {"propagationPolicy": "Background"}),
            "delete",
        )
    # with the agent flags operators pass through --job-agent-args (docs/troubleshooting.md)
    extra = ("--systemd-cgroup=true", "--restart-command=", "--wait-for-release=2", "--dry-run")
    t = job_spec.JobTemplate(image=rig.job_image, agent_args=extra)
    job = job_spec.manifest(t, rig.own_node, "enable", 1)
    job["metadata"]["name"] = f"flags-{uuid.uuid4().hex[:6]}"
    _ok(c("POST", JOBS, job), "create the agent Job with --job-agent-args")
    c("DELETE", f"{JOBS}/{job['metadata']['name']}", {"propagationPolicy": "Background"})
    event = {
        "metadata": {"generateName": f"{rig.own_node}.", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": rig.own_node, "apiVersion": "v1"},
        "reason": "EnableSucceeded",
        "message": "security test",
        "type": "Normal",
    }
    _ok(c("POST", "/api/v1/namespaces/default/events", event), "node event")
    layouts = [("fieldSelector", "metadata.name=lj-runtimekit-partition-layouts")]
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    _ok(c("GET", cms, None, query=layouts), "list the partition layouts ConfigMap")
    _ok(c("GET", cms, None, query=[*layouts, ("watch", "true"), ("timeoutSeconds", 1)]), "watch")
    assert c("GET", cms, None).status == 403, "other ConfigMaps of the namespace stay unreadable"
    _lease_cycle(rig, "controller", "lj-runtimekit-controller")


def test_device_plugin_token_does_all_the_device_plugin_does(rig: Rig, objs: Objects) -> None:
    d = rig.as_("device-plugin")
    node = _ok(d("GET", _node(rig.own_node), None), "read its node").body
    assert node["metadata"]["name"] == rig.own_node
    _ok(d("PATCH", _node(rig.own_node), {"metadata": {"labels": {LABEL: "8"}}}), "device label")
    _ok(d("PATCH", _node(rig.own_node), {"metadata": {"labels": {LABEL: None}}}), "drop it")
    # its node's partition fence (issue 39): list and watch the one node
    own = [("fieldSelector", f"metadata.name={rig.own_node}")]
    _ok(d("GET", "/api/v1/nodes", None, query=own), "list its node")
    _ok(
        d("GET", "/api/v1/nodes", None, query=[*own, ("watch", "true"), ("timeoutSeconds", 1)]),
        "watch",
    )
    q = [("fieldSelector", f"spec.nodeName={rig.own_node}")]
    listed = _ok(d("GET", "/api/v1/pods", None, query=q), "list its node's pods").body
    assert objs.tenant in {p["metadata"]["name"] for p in listed["items"]}
    pod = _ok(d("GET", _pods(rig, objs.tenant), None), "read the pod fresh").body
    mark = {
        "metadata": {
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "annotations": {DP_ANN: "now"},
        }
    }
    _ok(d("PATCH", _pods(rig, objs.tenant), mark), "mark the pod allocated")
    _post_as_the_plugin(rig, pod)
    _ok(d("POST", _events(rig), _plugin_event(rig, objs.tenant)), "pod event")
    rig.root("DELETE", f"{ND}/{rig.own_node}", None)
    body = {
        "apiVersion": "lj-runtimekit.aliyun.com/v1",
        "kind": "NodeDevices",
        "metadata": {"name": rig.own_node},
        "spec": {"nodeName": rig.own_node},
    }
    _ok(d("POST", ND, body), "create its NodeDevices")
    status = {"status": {"deviceCount": 8, "healthyCount": 8, "observedAt": "2026-01-01T00:00:00Z"}}
    _ok(d("PATCH", f"{ND}/{rig.own_node}/status", status), "publish its devices")
    got = rig.root("GET", f"{ND}/{rig.own_node}", None).body
    assert got["status"]["deviceCount"] == 8
    rig.root("DELETE", f"{ND}/{rig.own_node}", None)
    # mode dra: its node's ResourceSlices, listed by node and driver, and claims read
    name = f"sec-{rig.own_node}-slice"
    made = _ok(d("POST", SLICES, _slice(name, rig.own_node)), "create its node's slice").body
    q = [("fieldSelector", f"spec.nodeName={rig.own_node},spec.driver=lj-runtimekit.aliyun.com")]
    listed = _ok(d("GET", SLICES, None, query=q), "list its node's slices").body
    assert name in {i["metadata"]["name"] for i in listed["items"]}
    made["spec"]["pool"]["generation"] = 2
    _ok(d("PUT", f"{SLICES}/{name}", made), "replace its node's slice")
    _ok(d("GET", "/apis/resource.k8s.io/v1/resourceclaims", None), "list claims")
    _ok(d("DELETE", f"{SLICES}/{name}", None), "delete its node's slice")


def _post_as_the_plugin(rig: Rig, pod: Obj) -> None:
    """An Event on ``pod`` through the plugin's own ``kube.post_event`` with its token: what the
    plugin writes passes its policy (a refusal raises, naming the reason)."""

    async def post() -> None:
        cfg = aclient.Configuration()
        cfg.host = rig.admin.configuration.host
        cfg.ssl_ca_cert = rig.admin.configuration.ssl_ca_cert
        cfg.api_key = {"BearerToken": f"Bearer {rig.tokens['device-plugin']}"}
        meta = pod["metadata"]
        async with aclient.ApiClient(cfg) as api:
            await plugin_kube.post_event(
                api,
                (meta["namespace"], meta["name"], meta["uid"]),
                "AllocationMismatch",
                "security test",
                node=rig.own_node,
            )

    asyncio.run(post())


def test_exporter_token_does_all_the_exporter_does(rig: Rig, objs: Objects) -> None:
    e = rig.as_("exporter")
    q = [("fieldSelector", f"spec.nodeName={rig.own_node}")]
    listed = _ok(e("GET", "/api/v1/pods", None, query=q), "list its node's pods").body
    assert objs.tenant in {p["metadata"]["name"] for p in listed["items"]}
    _ok(
        e("GET", "/api/v1/pods", None, query=[*q, ("watch", "true"), ("timeoutSeconds", 1)]),
        "watch",
    )


def test_without_the_controller_deployment_nobody_else_is_refused(rig: Rig) -> None:
    """The job-image policy reads the controller's Deployment. Once it named that parameter on
    the policy for every controller write, and the apiserver resolves parameters before
    matchConditions: an undeploy that deleted the Deployment first had every node write in the
    cluster refused ("no params found"), the admin's included. Now only that image check reads it,
    and a missing Deployment skips it; the controller's token still needs an agent image."""
    deployment = f"/apis/apps/v1/namespaces/{NS}/deployments/lj-runtimekit-controller"
    saved = ok(rig.root("GET", deployment, None), "the controller Deployment")
    _ok(rig.root("DELETE", deployment, None), "delete the Deployment")
    try:

        def admin_patches_a_node() -> bool:
            got = rig.root(
                "PATCH",
                _node(rig.other_node),
                {"metadata": {"annotations": {"sec-test/after-undeploy": "x"}}},
            )
            return 200 <= got.status < 300

        eventually("an admin's node write with the Deployment gone", admin_patches_a_node)
        evil = tampered(rig, lambda j, p, c: c.update(image="evil.example/busybox:1"))
        got = rig.as_("controller")("POST", JOBS, evil)
        assert got.status in (403, 422), (got.status, got.message)
        assert "runs a lj-runtimekit-controller-job-agent image" in got.message, got.message
    finally:
        for k in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
            saved["metadata"].pop(k, None)
        saved.pop("status", None)
        _ok(
            rig.root("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", saved),
            "the Deployment back",
        )


# ---- a renamed node-label prefix (#22 item 4): the chart widens the plugin's policy to it, and
# only to it (docs/node-labels.md).

DP_POLICY = "lj-runtimekit-device-plugin-own-node"
RENAMED = "gpu.example.com"


def _chart_policy(prefix: str) -> dict[str, Any]:
    """The device plugin's admission policy as the chart renders it for ``prefix``."""
    config = f"node_label_prefix: {prefix}\n"
    args = [
        str(tool_dir() / "helm"),
        "template",
        "lj-runtimekit",
        str(CHART),
        "-n",
        "kube-system",
        "--set-string",
        f"devicePlugin.config={config}",
    ]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    policies: list[dict[str, Any]] = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == DP_POLICY
    ]
    [policy] = policies
    return policy


_LABEL_VALUES = itertools.count()


def _label_status(rig: Rig, key: str) -> int:
    """The device plugin's token sets ``key`` on its own node; the HTTP status (422: refused by
    the admission policy).

    Every probe writes a new value, and what it wrote is taken off by the admin when the device
    plugin may no longer take it off: a probe let through just before a stricter policy came into
    force would otherwise leave its label, and the same value again is a no-op patch, which the
    policy rightly allows (CI saw "the default policy back not reached" that way)."""
    d = rig.as_("device-plugin")
    body = {"metadata": {"labels": {key: f"v{next(_LABEL_VALUES)}"}}}
    status = d("PATCH", f"/api/v1/nodes/{rig.own_node}", body).status
    if status == 200:
        off = {"metadata": {"labels": {key: None}}}
        if d("PATCH", f"/api/v1/nodes/{rig.own_node}", off).status != 200:
            rig.root("PATCH", f"/api/v1/nodes/{rig.own_node}", off)
    return status


def _operator_policy(prefix: str) -> dict[str, Any]:
    """The device plugin's admission policy as the operator renders it for a RuntimeKitPolicy
    whose device plugin config names ``prefix``."""
    bundle = operator_bundle.load()
    config = f"version: v1\nnode_label_prefix: {prefix}\n"
    obj = {
        "metadata": {"name": "suite", "uid": "u-1"},
        "spec": {"namespace": NS, "components": {"devicePlugin": {"config": config}}},
    }
    spec = operator_policy.parse(obj, bundle.registry, bundle.version)
    objs = operator_render.render(spec, "device-plugin", bundle.objects["device-plugin"])
    [policy] = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == DP_POLICY
    ]
    return policy


def _renamed_prefix_admitted_and_no_other(rig: Rig, renamed: dict[str, Any]) -> None:
    assert _label_status(rig, f"{RENAMED}/count") == 422, "deploy/'s policy admits the default only"
    original = kubectl(rig.cluster, "get", "validatingadmissionpolicy", DP_POLICY, "-o", "yaml")
    try:
        kubectl(
            rig.cluster,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=yaml.safe_dump(renamed),
        )
        eventually(
            "the renamed prefix admitted", lambda: _label_status(rig, f"{RENAMED}/count") == 200
        )
        assert _label_status(rig, "lj-runtimekit.aliyun.com/count") == 200, (
            "the default stays (rename)"
        )
        assert _label_status(rig, "other.example.com/count") == 422
        assert _label_status(rig, f"{RENAMED}x/count") == 422, "a prefix of the prefix is not it"
    finally:
        restored = yaml.safe_load(original)
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            restored["metadata"].pop(key, None)
        restored.pop("status", None)
        kubectl(
            rig.cluster,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=yaml.safe_dump(restored),
        )
        eventually("the default policy back", lambda: _label_status(rig, f"{RENAMED}/count") == 422)


def test_a_renamed_label_prefix_is_admitted_once_the_chart_names_it_and_no_other(rig: Rig) -> None:
    _renamed_prefix_admitted_and_no_other(rig, _chart_policy(RENAMED))


def test_a_renamed_label_prefix_is_admitted_once_the_operator_renders_it_and_no_other(
    rig: Rig,
) -> None:
    """The operator path (#39): a RuntimeKitPolicy renaming node_label_prefix renders the
    plugin's admission policy with the new prefix, as the chart does."""
    _renamed_prefix_admitted_and_no_other(rig, _operator_policy(RENAMED))
