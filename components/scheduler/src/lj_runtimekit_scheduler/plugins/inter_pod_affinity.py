"""InterPodAffinity: required pod affinity and anti-affinity filter, the existing pods' required
anti-affinity repels the incoming pod (the symmetric check), preferred terms — the pod's own and
the existing pods' — score; kube-scheduler's ``interpodaffinity`` plugin.

PreFilter computes, once per cycle, kube-scheduler's ``preFilterState``: (topology key, value)
→ how many placed pods match the pod's required affinity terms (all of them), its required
anti-affinity terms (each), and how many placed pods carry a required anti-affinity term that
matches the pod. Filter is then a few lookups per node. Counts come from the cluster state's
index (:mod:`..placed`), which holds assumed pods too: a gang member placed earlier in the same
gang cycle counts for the next one.

A namespaceSelector is resolved against the namespaces' labels (the namespace informer); a
term's ``matchLabelKeys``/``mismatchLabelKeys`` were merged into its selector by the apiserver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..framework import OK, SKIP, CycleState, PodChange, Slot, Status, fail
from ..labels import NOTHING
from ..model import Pod
from ..placed import PREFERRED, PREFERRED_ANTI, REQUIRED, REQUIRED_ANTI, Condition, NodeCounts
from ..placed import Query as PodQuery
from ..state import ClusterState, NodeInfo
from ..terms import AffinityTerm

NAME = "InterPodAffinity"
AFFINITY_MISMATCH = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_MISMATCH = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"

Pair = tuple[str, str]
"""(topology key, value)."""
TopologyScore = dict[str, dict[str, int]]
"""topology key → value → score."""


@dataclass(frozen=True)
class Args:
    """kube-scheduler's ``InterPodAffinityArgs``, at its defaults."""

    hard_pod_affinity_weight: int = 1
    """Score weight of an existing pod's *required* affinity term the incoming pod matches."""
    ignore_preferred_terms_of_existing_pods: bool = False
    """Score only when the incoming pod has preferred terms of its own."""


@dataclass
class FilterState:
    """kube-scheduler's ``preFilterState`` of one pod."""

    required: tuple[AffinityTerm, ...]
    required_anti: tuple[AffinityTerm, ...]
    self_match: bool
    """The pod matches all its own required affinity terms (it may be the first of a group
    that wants to be together)."""
    affinity: dict[Pair, int] = field(default_factory=dict)
    anti: dict[Pair, int] = field(default_factory=dict)
    existing: dict[Pair, int] = field(default_factory=dict)
    hits: tuple[
        tuple[tuple[str, frozenset[str]], ...],
        tuple[tuple[str, frozenset[str]], ...],
        tuple[tuple[str, frozenset[str]], ...],
    ] = ((), (), ())
    """For :attr:`affinity`, :attr:`anti` and :attr:`existing`: each topology key with the
    values counted above 0 (what Filter looks up, one set per key)."""

    def finish(self) -> None:
        """Fill :attr:`hits` from the counts."""

        def by_key(counts: dict[Pair, int]) -> tuple[tuple[str, frozenset[str]], ...]:
            keys: dict[str, set[str]] = {}
            for (k, v), n in counts.items():
                if n > 0:
                    keys.setdefault(k, set()).add(v)
            return tuple((k, frozenset(vs)) for k, vs in keys.items())

        self.hits = (by_key(self.affinity), by_key(self.anti), by_key(self.existing))


_FILTER: Slot[FilterState] = Slot("InterPodAffinity/filter")
_SCORE: Slot[TopologyScore] = Slot("InterPodAffinity/score")


class Cluster:
    """What the plugin reads of the cluster state: placed pods, node and namespace labels."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def node_labels(self, node: str) -> Mapping[str, str] | None:
        info = self.state.nodes.get(node)
        return None if info is None else info.node.label_map()

    def ns_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.state.namespace_labels.get(namespace)

    def resolve(self, term: AffinityTerm) -> AffinityTerm:
        """The term with its namespaceSelector merged into its namespaces (kube-scheduler's
        ``mergeAffinityTermNamespacesIfNotEmpty``); ``{}`` stays: it selects every namespace."""
        ns_sel = term.namespace_selector
        if ns_sel.nothing or ns_sel.empty:
            return term
        names = {n for n, lbl in self.state.namespace_labels.items() if ns_sel.matches(lbl)}
        return AffinityTerm(term.selector, term.namespaces | names, NOTHING, term.topology_key)

    def add(self, into: dict[Pair, int], key: str, counts: NodeCounts, by: int = 1) -> bool:
        """Add ``by`` × the pods of ``counts`` to their nodes' (``key``, value); whether any
        node had the key."""
        added = False
        for node, n in counts.items():
            labels = self.node_labels(node)
            value = None if labels is None else labels.get(key)
            if value is not None:
                into[(key, value)] = into.get((key, value), 0) + by * n
                added = True
        return added


def condition(term: AffinityTerm) -> Condition:
    """The pods a resolved ``term`` selects, as a query of the index."""
    every_ns = term.namespace_selector.empty
    return Condition(None if every_ns else term.namespaces, term.selector)


def matches_all(terms: Iterable[AffinityTerm], pod: Pod) -> bool:
    """``podMatchesAllAffinityTerms`` (no terms: False), the terms resolved."""
    found = False
    for t in terms:
        if not t.matches(pod.namespace, pod.label_map(), None):
            return False
        found = True
    return found


def filter_state(cluster: Cluster, pod: Pod) -> FilterState:
    """The counts of one pod's PreFilter."""
    placed = cluster.state.placed
    req = tuple(cluster.resolve(t) for t in pod.affinity.required)
    anti = tuple(cluster.resolve(t) for t in pod.affinity.required_anti)
    fs = FilterState(req, anti, matches_all(req, pod))
    if req:
        together = placed.per_node(PodQuery(tuple(condition(t) for t in req)))
        for t in req:
            cluster.add(fs.affinity, t.topology_key, together)
    for t in anti:
        cluster.add(fs.anti, t.topology_key, placed.per_node(PodQuery((condition(t),))))
    ns_labels = cluster.ns_labels(pod.namespace)
    for term, counts in placed.carried(REQUIRED_ANTI).items():
        if term.matches(pod.namespace, pod.label_map(), ns_labels):
            cluster.add(fs.existing, term.topology_key, counts)
    fs.finish()
    return fs


def _bump(counts: dict[Pair, int], labels: Mapping[str, str], key: str, by: int) -> None:
    """kube-scheduler's ``topologyToMatchedTermCount.update``: an entry down to 0 goes."""
    value = labels.get(key)
    if value is None:
        return
    n = counts.get((key, value), 0) + by
    if n:
        counts[(key, value)] = n
    else:
        counts.pop((key, value), None)


def moved(
    fs: FilterState, pod: Pod, changes: Sequence[PodChange], ns_labels: Mapping[str, str] | None
) -> FilterState:
    """``fs`` after pods were put on or taken off nodes (kube-scheduler's ``AddPod`` and
    ``RemovePod``, ``updateWithPod``): each one counts, as PreFilter counted the placed pods,
    for the pod's required affinity (when it matches all its terms), for each required
    anti-affinity term it matches, and for each of its own required anti-affinity terms that
    matches the pod. ``fs`` is not changed."""
    out = FilterState(
        fs.required,
        fs.required_anti,
        fs.self_match,
        dict(fs.affinity),
        dict(fs.anti),
        dict(fs.existing),
    )
    pod_labels = pod.label_map()
    together = tuple(condition(t) for t in fs.required)
    apart = [(t, condition(t)) for t in fs.required_anti]
    for other, node, by in changes:
        if other.uid == pod.uid:
            continue
        labels = node.label_map()
        if together and all(c.holds(other) for c in together):
            for t in fs.required:
                _bump(out.affinity, labels, t.topology_key, by)
        for t, c in apart:
            if c.holds(other):
                _bump(out.anti, labels, t.topology_key, by)
        for term in other.affinity.required_anti:
            if term.matches(pod.namespace, pod_labels, ns_labels):
                _bump(out.existing, labels, term.topology_key, by)
    out.finish()
    return out


_AFFINITY = fail(AFFINITY_MISMATCH, unresolvable=True)
_ANTI = fail(ANTI_AFFINITY_MISMATCH)
_EXISTING = fail(EXISTING_ANTI_AFFINITY)


def fits(fs: FilterState, labels: Mapping[str, str]) -> Status:
    """The Filter verdict on a node with ``labels``, in kube-scheduler's order and words."""
    affinity, anti, existing = fs.hits
    if fs.required:
        values = dict(affinity)
        exist = True
        for t in fs.required:
            value = labels.get(t.topology_key)
            if value is None:  # every topology key must be on the node
                return _AFFINITY
            if value not in values.get(t.topology_key, ()):
                exist = False
        if not exist and not (not fs.affinity and fs.self_match):
            return _AFFINITY
    # each term's key is among the keys counted, or nothing it selects is anywhere
    for key, hit in anti:
        value = labels.get(key)
        if value is not None and value in hit:
            return _ANTI
    # kube-scheduler looks up every (key, value) of the node; only the keys counted can hit
    for key, hit in existing:
        value = labels.get(key)
        if value is not None and value in hit:
            return _EXISTING
    return OK


def topology_score(cluster: Cluster, pod: Pod, args: Args) -> TopologyScore | None:
    """kube-scheduler's PreScore ``topologyScore``; None when nothing applies (Skip)."""
    mine = pod.affinity
    if args.ignore_preferred_terms_of_existing_pods and not (mine.preferred or mine.preferred_anti):
        return None
    placed = cluster.state.placed
    pairs: dict[Pair, int] = {}
    added = False
    for terms, sign in ((mine.preferred, 1), (mine.preferred_anti, -1)):
        for wt in terms:
            t = cluster.resolve(wt.term)
            counts = placed.per_node(PodQuery((condition(t),)))
            added |= cluster.add(pairs, t.topology_key, counts, sign * wt.weight)
    ns_labels = cluster.ns_labels(pod.namespace)
    pod_labels = pod.label_map()
    if args.hard_pod_affinity_weight > 0:
        for term, counts in placed.carried(REQUIRED).items():
            if term.matches(pod.namespace, pod_labels, ns_labels):
                added |= cluster.add(
                    pairs, term.topology_key, counts, args.hard_pod_affinity_weight
                )
    for kind, sign in ((PREFERRED, 1), (PREFERRED_ANTI, -1)):
        for wt, counts in placed.carried_weighted(kind).items():
            if wt.term.matches(pod.namespace, pod_labels, ns_labels):
                added |= cluster.add(pairs, wt.term.topology_key, counts, sign * wt.weight)
    if not added:
        return None
    out: TopologyScore = {}
    for (key, value), n in pairs.items():
        out.setdefault(key, {})[value] = n
    return out


def node_score(scores: TopologyScore, labels: Mapping[str, str]) -> int:
    total = 0
    for key, values in scores.items():
        value = labels.get(key)
        if value is not None:
            total += values.get(value, 0)
    return total


def normalize_min_max(scores: dict[str, int]) -> dict[str, int]:
    """kube-scheduler's: 100 × (score − min) / (max − min), truncated; all 0 when equal."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    diff = high - low
    if diff <= 0:
        return dict.fromkeys(scores, 0)
    return {n: int(100.0 * (float(s - low) / float(diff))) for n, s in scores.items()}


class InterPodAffinity:
    NAME = NAME
    CROSS_NODE = True

    def __init__(self, args: Args, state: ClusterState) -> None:
        self.args = args
        self.cluster = Cluster(state)

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        fs = filter_state(self.cluster, pod)
        if not fs.existing and not fs.required and not fs.required_anti:
            return SKIP
        cs.write(_FILTER, fs)
        return OK

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        fs = cs.read(_FILTER)
        return OK if fs is None else fits(fs, info.node.label_map())

    def update_with_pods(self, cs: CycleState, pod: Pod, changes: Sequence[PodChange]) -> None:
        fs = cs.read(_FILTER)
        if fs is not None:
            cs.write(_FILTER, moved(fs, pod, changes, self.cluster.ns_labels(pod.namespace)))

    def pre_score(self, cs: CycleState, pod: Pod, nodes: list[NodeInfo]) -> Status:
        scores = topology_score(self.cluster, pod, self.args)
        if scores is None:
            return SKIP
        cs.write(_SCORE, scores)
        return OK

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        scores = cs.read(_SCORE)
        return 0 if scores is None else node_score(scores, info.node.label_map())

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        return normalize_min_max(scores)


def new(args: Args, state: ClusterState) -> InterPodAffinity:
    return InterPodAffinity(args, state)
