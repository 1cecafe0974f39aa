"""The pods that hold nodes (bound and assumed), indexed for the plugins whose verdict on a
node depends on pods on other nodes (InterPodAffinity, PodTopologySpread). Pure.

kube-scheduler walks every pod of every node in their PreFilter (in 16 goroutines). Here the
walk is replaced by what it computes, kept up to date as pods come and go:

- the pods by label, by label key and by namespace, so a selector starts from the few pods that
  can match (:meth:`PlacedPods.select`);
- per *query* (one or more (namespaces, selector) conditions that must all hold), how many
  matching pods each node holds (:meth:`PlacedPods.per_node`): computed once, then moved by
  each pod that comes or goes; the 256 most recently asked are kept;
- the inter-pod terms the pods carry, grouped by term: node → how many pods carry it there
  (:meth:`PlacedPods.carried`). Replicas share their terms, so an incoming pod checks a few
  groups, not every pod with affinity (kube-scheduler's ``PodsWithRequiredAntiAffinity``).

Counts are per node, not per topology value: the plugins map nodes to domains with the nodes'
labels of the moment, so a relabelled node needs nothing here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .labels import Selector
from .model import Pod
from .terms import AffinityTerm, WeightedTerm

REQUIRED_ANTI, REQUIRED, PREFERRED, PREFERRED_ANTI = "required_anti", "required", "pref", "anti"
CARRIED_KINDS = (REQUIRED_ANTI, REQUIRED, PREFERRED, PREFERRED_ANTI)
MAX_QUERIES = 256
K = TypeVar("K")

NodeCounts = dict[str, int]
"""node name → how many pods there."""


@dataclass(frozen=True)
class Condition:
    """Pods of ``namespaces`` (None: any namespace) whose labels ``selector`` matches."""

    namespaces: frozenset[str] | None
    selector: Selector

    def holds(self, pod: Pod) -> bool:
        if self.namespaces is not None and pod.namespace not in self.namespaces:
            return False
        return self.selector.matches(pod.label_map())


@dataclass(frozen=True)
class Query:
    conditions: tuple[Condition, ...]
    live_only: bool = False
    """Leave out pods being deleted (PodTopologySpread counts no terminating pod)."""

    def holds(self, pod: Pod) -> bool:
        if self.live_only and pod.deleting:
            return False
        return all(c.holds(pod) for c in self.conditions)


def _carried(pod: Pod) -> list[tuple[str, AffinityTerm | WeightedTerm]]:
    a = pod.affinity
    if not a.any:
        return []
    return [
        *((REQUIRED_ANTI, t) for t in a.required_anti),
        *((REQUIRED, t) for t in a.required),
        *((PREFERRED, t) for t in a.preferred),
        *((PREFERRED_ANTI, t) for t in a.preferred_anti),
    ]


def _bump(counts: NodeCounts, node: str, by: int) -> None:
    n = counts.get(node, 0) + by
    if n > 0:
        counts[node] = n
    else:
        counts.pop(node, None)


class PlacedPods:
    def __init__(self) -> None:
        self.pods: dict[str, tuple[Pod, str]] = {}
        """uid → (pod, node)."""
        self._by_label: dict[tuple[str, str], set[str]] = {}
        self._by_key: dict[str, set[str]] = {}
        self._by_namespace: dict[str, set[str]] = {}
        self._carried: dict[str, dict[Any, NodeCounts]] = {k: {} for k in CARRIED_KINDS}
        self._queries: OrderedDict[Query, NodeCounts] = OrderedDict()

    # -- what the cluster state tells it
    def add(self, pod: Pod, node: str) -> None:
        self.remove(pod.uid)
        uid = pod.uid
        self.pods[uid] = (pod, node)
        for kv in pod.labels:
            self._by_label.setdefault(kv, set()).add(uid)
            self._by_key.setdefault(kv[0], set()).add(uid)
        self._by_namespace.setdefault(pod.namespace, set()).add(uid)
        for kind, term in _carried(pod):
            _bump(self._carried[kind].setdefault(term, {}), node, 1)
        for q, counts in self._queries.items():
            if q.holds(pod):
                _bump(counts, node, 1)

    def remove(self, uid: str) -> None:
        held = self.pods.pop(uid, None)
        if held is None:
            return
        pod, node = held
        for kv in pod.labels:
            _discard(self._by_label, kv, uid)
            _discard(self._by_key, kv[0], uid)
        _discard(self._by_namespace, pod.namespace, uid)
        for kind, term in _carried(pod):
            groups = self._carried[kind]
            counts = groups.get(term)
            if counts is not None:
                _bump(counts, node, -1)
                if not counts:
                    del groups[term]
        for q, counts in self._queries.items():
            if q.holds(pod):
                _bump(counts, node, -1)

    # -- what the plugins ask
    def select(self, cond: Condition) -> Iterator[tuple[Pod, str]]:
        """(pod, node) of every placed pod ``cond`` holds for."""
        for uid in self._candidates(cond):
            pod, node = self.pods[uid]
            if cond.holds(pod):
                yield pod, node

    def _candidates(self, cond: Condition) -> Collection[str]:
        """A superset of the pods ``cond`` holds for, as small as one index makes it."""
        if cond.selector.nothing:
            return ()
        best: Collection[str] = self.pods.keys()
        for r in cond.selector.requirements:
            if r.operator == "In":
                if len(r.values) == 1:
                    found = self._by_label.get((r.key, r.values[0]), set())
                else:
                    found = set().union(*(self._by_label.get((r.key, v), set()) for v in r.values))
            elif r.operator == "Exists":
                found = self._by_key.get(r.key, set())
            else:
                continue
            if len(found) < len(best):
                best = found
        if cond.namespaces is not None and len(cond.namespaces) <= 4:
            in_ns: set[str] = set()
            for ns in cond.namespaces:
                in_ns |= self._by_namespace.get(ns, set())
            if len(in_ns) < len(best):
                best = in_ns
        return best

    def per_node(self, query: Query) -> NodeCounts:
        """node → how many placed pods ``query`` holds for (nodes with none left out). The
        mapping is kept up to date by later changes: read it, never change it."""
        counts = self._queries.get(query)
        if counts is not None:
            self._queries.move_to_end(query)
            return counts
        counts = {}
        first, *rest = query.conditions
        for pod, node in self.select(first):
            if all(c.holds(pod) for c in rest) and not (query.live_only and pod.deleting):
                counts[node] = counts.get(node, 0) + 1
        self._queries[query] = counts
        if len(self._queries) > MAX_QUERIES:
            self._queries.popitem(last=False)
        return counts

    def carried(self, kind: str) -> Mapping[AffinityTerm, NodeCounts]:
        """Required term → node → how many placed pods carry that term there (``kind``
        :data:`REQUIRED` or :data:`REQUIRED_ANTI`); read only."""
        return self._carried[kind]

    def carried_weighted(self, kind: str) -> Mapping[WeightedTerm, NodeCounts]:
        """The same for preferred terms (``kind`` :data:`PREFERRED` or :data:`PREFERRED_ANTI`)."""
        return self._carried[kind]


def _discard(index: dict[K, set[str]], key: K, uid: str) -> None:
    found = index.get(key)
    if found is not None:
        found.discard(uid)
        if not found:
            del index[key]
