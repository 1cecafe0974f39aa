"""Services and the pod controllers kube-scheduler's default spreading looks at (ReplicaSets,
StatefulSets, ReplicationControllers): only their selectors. Pure.

PodTopologySpread gives a pod without ``topologySpreadConstraints`` the cluster's default
constraints with the selector :meth:`Workloads.default_selector` deduces, as kube-scheduler's
``helper.DefaultSelector``: the selectors of every Service of the pod's namespace that selects
the pod, together with its controller's selector when that is a ReplicaSet, StatefulSet or
ReplicationController. A pod none of these select gets no default constraint.
"""

from __future__ import annotations

from typing import Any

from . import labels as sel
from .labels import Selector
from .model import Pod

SERVICES, REPLICATION_CONTROLLERS = "services", "replicationcontrollers"
REPLICA_SETS, STATEFUL_SETS = "replicasets", "statefulsets"
KINDS = (SERVICES, REPLICATION_CONTROLLERS, REPLICA_SETS, STATEFUL_SETS)
_CONTROLLERS = {
    ("v1", "ReplicationController"): REPLICATION_CONTROLLERS,
    ("apps/v1", "ReplicaSet"): REPLICA_SETS,
    ("apps/v1", "StatefulSet"): STATEFUL_SETS,
}


def selector_of(kind: str, obj: dict[str, Any]) -> Selector | None:
    """The selector of a Service or controller object (None: a Service selecting no pod);
    raises ValueError on a malformed one."""
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise ValueError(f"{kind}: spec is not an object")
    if kind in (SERVICES, REPLICATION_CONTROLLERS):
        return sel.from_map(spec.get("selector"), f"{kind} spec.selector")
    return sel.parse(spec.get("selector"), f"{kind} spec.selector")


class Workloads:
    def __init__(self) -> None:
        self._objects: dict[str, dict[str, dict[str, Selector | None]]] = {k: {} for k in KINDS}
        """kind → namespace → name → selector."""

    def put(self, kind: str, namespace: str, name: str, selector: Selector | None) -> None:
        self._objects[kind].setdefault(namespace, {})[name] = selector

    def delete(self, kind: str, namespace: str, name: str) -> None:
        names = self._objects[kind].get(namespace)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self._objects[kind][namespace]

    def clear(self, kind: str) -> None:
        self._objects[kind].clear()

    def names(self, kind: str) -> set[tuple[str, str]]:
        """(namespace, name) of every object of ``kind`` known."""
        return {(ns, n) for ns, names in self._objects[kind].items() for n in names}

    def default_selector(self, pod: Pod) -> Selector:
        """The selector of the pod's default spread constraints (empty: none apply)."""
        pod_labels = pod.label_map()
        reqs: set[sel.LabelRequirement] = set()
        for s in self._objects[SERVICES].get(pod.namespace, {}).values():
            if s is not None and s.matches(pod_labels):
                reqs.update(s.requirements)
        ref = pod.controller
        kind = None if ref is None else _CONTROLLERS.get((ref.api_version, ref.kind))
        if ref is not None and kind is not None:
            found = self._objects[kind].get(pod.namespace, {}).get(ref.name)
            if found is not None and not found.nothing:
                reqs.update(found.requirements)
        return Selector(tuple(sorted(reqs)))
