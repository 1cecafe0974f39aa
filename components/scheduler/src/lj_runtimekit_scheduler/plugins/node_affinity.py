"""NodeAffinity: nodeSelector and required node affinity filter; preferred terms score."""

from __future__ import annotations

from collections.abc import Mapping

from ..framework import OK, SKIP, CycleState, Status, fail, normalize_max
from ..model import Node, Pod, Requirement, Term
from ..state import NodeInfo

NAME = "NodeAffinity"
MISMATCH = fail("node(s) didn't match Pod's node affinity/selector", unresolvable=True)


def _holds(r: Requirement, node: Node, labels: Mapping[str, str]) -> bool:
    if r.field:
        # only metadata.name is a supported field (as in the apiserver)
        value: str | None = node.name if r.key == "metadata.name" else None
    else:
        value = labels.get(r.key)
    op = r.operator
    if op == "In":
        return value is not None and value in r.values
    if op == "NotIn":
        return value is None or value not in r.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(r.values) == 1:
        try:
            a, b = int(value), int(r.values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def term_matches(term: Term, node: Node, labels: Mapping[str, str]) -> bool:
    """All requirements hold; an empty term matches no node (as in kube-scheduler)."""
    return bool(term.requirements) and all(_holds(r, node, labels) for r in term.requirements)


CONFLICT = fail("pod affinity terms conflict", unresolvable=True)
"""Every term names nodes, and no node is named by all requirements of any term."""


def named_nodes(pod: Pod) -> frozenset[str] | None:
    """The only nodes the pod can go to when every required term names them with
    ``matchFields`` ``metadata.name In`` (kube-scheduler's PreFilter result: the other nodes are
    not evaluated, "didn't satisfy plugin(s) [NodeAffinity]"); the union over terms of each
    term's intersection. None: a term names no node (any node may match it)."""
    if not pod.required_terms:
        return None
    names: set[str] = set()
    for term in pod.required_terms:
        named = [
            set(r.values)
            for r in term.requirements
            if r.field and r.key == "metadata.name" and r.operator == "In"
        ]
        if not named:
            return None
        names |= set.intersection(*named)
    return frozenset(names)


def fits(pod: Pod, node: Node) -> bool:
    labels = node.label_map()
    if any(labels.get(k) != v for k, v in pod.node_selector):
        return False
    if pod.required_terms is None:
        return True
    return any(term_matches(t, node, labels) for t in pod.required_terms)


def preference(pod: Pod, node: Node) -> int:
    labels = node.label_map()
    return sum(p.weight for p in pod.preferred_terms if term_matches(p.term, node, labels))


class NodeAffinity:
    NAME = NAME

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        if not pod.node_selector and pod.required_terms is None:
            return SKIP
        names = named_nodes(pod)
        if names is None:
            return OK
        if not names:
            return CONFLICT
        return Status(nodes=names)

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        return OK if fits(pod, info.node) else MISMATCH

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        return preference(pod, info.node) if pod.preferred_terms else 0

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        return normalize_max(scores)


def new() -> NodeAffinity:
    return NodeAffinity()
