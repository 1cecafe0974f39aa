"""A generated case and its materialisation: the same case, once per scheduler, as API objects.

A case is a few nodes, pods already bound to them, and one *probe* pod to schedule. It is written
with abstract names: ``#n0`` is the case's node ``n0`` and ``@z1`` a value unique to the copy
(zone, rack: whatever a topology-aware rule would group nodes by). :func:`materialise` turns a
case into one copy's objects, so that kube-scheduler's copy and ours are identical but for
those names, and copies never share a node, a namespace or a topology value.

Every probe carries the copy's isolation label in its ``nodeSelector``: it may only go to its
own copy's nodes, and every other node in the cluster refuses it (with whatever reason comes
first there, the same for both schedulers, since the other copies are alike).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]

PREFIX = "oracle.lj-runtimekit.io"
CASE_LABEL = f"{PREFIX}/case"
"""On every node and pod of one copy of one case: the copy's token."""
RUN_LABEL = f"{PREFIX}/run"
"""On everything a run makes, so one selector finds (and deletes) it."""
BATCH_LABEL = f"{PREFIX}/batch"
ROLE_LABEL = f"{PREFIX}/role"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KUBE, OURS = "k", "o"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    unschedulable: bool = False
    devices: tuple[Mapping[str, Any], ...] = ()
    """GPUs of a NodeDevices inventory (GPU cases only)."""


@dataclass(frozen=True)
class PodSpec:
    name: str
    spec: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    """For a pod already bound: the case's node it is on."""


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    families: tuple[str, ...]
    nodes: tuple[NodeSpec, ...]
    existing: tuple[PodSpec, ...]
    probes: tuple[PodSpec, ...]
    gpu: bool = False
    """Our scheduler only, judged by the checker (kube-scheduler cannot choose our GPUs)."""

    @property
    def key(self) -> str:
        return f"{self.seed}:{self.index}"

    def describe(self) -> str:
        """The case as a reproducible description: the command that regenerates it and every
        object of it, abstract names kept."""
        lines = [
            f"case {self.key} (families: {', '.join(self.families) or '-'}); reproduce with "
            f"`python -m lj_runtimekit_testkit.oracle --seed {self.seed} --only {self.index}`"
        ]
        for n in self.nodes:
            extra = " cordoned" if n.unschedulable else ""
            lines.append(
                f"  node {n.name}{extra}: labels={_j(n.labels)} allocatable={_j(n.allocatable)}"
                + (f" taints={_j(list(n.taints))}" if n.taints else "")
                + (f" devices={len(n.devices)}" if n.devices else "")
            )
        for p in self.existing:
            lines.append(f"  pod {p.name} on {p.node}: {_j(p.spec)}")
        for p in self.probes:
            lines.append(f"  probe {p.name}: {_j(p.spec)}")
        return "\n".join(lines)


def _j(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Copy:
    """One scheduler's copy of a case."""

    case: Case
    run: str
    batch: int
    who: str
    """:data:`KUBE` or :data:`OURS`."""
    namespace: str
    scheduler: str

    @property
    def token(self) -> str:
        return f"{self.run}-{self.case.index}{self.who}"

    def node_name(self, abstract: str) -> str:
        return f"{self.token}-{abstract}"

    def name(self, text: str) -> str:
        """A concrete string for an abstract one (``#n0`` a node, ``@z1`` a copy's value)."""
        if text.startswith("#"):
            return self.node_name(text[1:])
        if text.startswith("@"):
            return f"{self.token}-{text[1:]}"
        return text

    def concrete(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.name(obj)
        if isinstance(obj, Mapping):
            return {k: self.concrete(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.concrete(v) for v in obj]
        return obj

    def labels(self, role: str) -> dict[str, str]:
        return {
            CASE_LABEL: self.token,
            RUN_LABEL: self.run,
            BATCH_LABEL: str(self.batch),
            ROLE_LABEL: role,
        }


UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def intended_taints(node: NodeSpec) -> list[Json]:
    """The taints the node is meant to have once settled: its own, and on a cordoned node the
    unschedulable taint (kube-controller-manager adds it; written at once so that no scheduler
    sees the node without it)."""
    taints = [dict(t) for t in node.taints]
    if node.unschedulable:
        taints.append(dict(UNSCHEDULABLE_TAINT))
    return taints


def node_manifest(copy: Copy, node: NodeSpec) -> Json:
    name = copy.node_name(node.name)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **{k: copy.name(v) for k, v in node.labels.items()},
        **copy.labels("node"),
    }
    spec: Json = {"taints": intended_taints(node)}
    if node.unschedulable:
        spec["unschedulable"] = True
    capacity = dict(node.allocatable)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def pod_manifest(copy: Copy, pod: PodSpec, role: str) -> Json:
    spec: Json = copy.concrete(dict(pod.spec))
    spec.setdefault("restartPolicy", "Never")
    spec.setdefault("terminationGracePeriodSeconds", 0)
    if pod.node is not None:
        spec["nodeName"] = copy.node_name(pod.node)
        spec["schedulerName"] = "default-scheduler"
    else:
        spec["schedulerName"] = copy.scheduler
        selector = dict(spec.get("nodeSelector") or {})
        selector[CASE_LABEL] = copy.token
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"c{copy.case.index}-{pod.name}",
            "namespace": copy.namespace,
            "labels": {**copy.concrete(dict(pod.labels)), **copy.labels(role)},
        },
        "spec": spec,
    }


def node_devices_manifest(copy: Copy, node: NodeSpec) -> Json:
    """The NodeDevices inventory our scheduler reads (GPU cases)."""
    name = copy.node_name(node.name)
    return {
        "apiVersion": "lj-runtimekit.aliyun.com/v1",
        "kind": "NodeDevices",
        "metadata": {"name": name, "labels": copy.labels("devices")},
        "spec": {"nodeName": name},
        "status": {
            "deviceCount": len(node.devices),
            "healthyCount": sum(1 for d in node.devices if d.get("healthy", True)),
            "devices": [dict(d) for d in node.devices],
        },
    }
