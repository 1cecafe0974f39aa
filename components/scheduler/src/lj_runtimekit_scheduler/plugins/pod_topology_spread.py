"""PodTopologySpread: ``whenUnsatisfiable: DoNotSchedule`` constraints filter, ScheduleAnyway
ones score; a pod without constraints gets the cluster's default ones (kube-scheduler's
``podtopologyspread`` plugin, its ``System`` or ``List`` defaulting).

Which nodes are a constraint's domains (they have every constraint's topology key and pass its
nodeAffinityPolicy/nodeTaintsPolicy) depends on the nodes and the pod's node affinity and
tolerations only, not on where pods are: it is computed once per pod shape and kept until a
node comes, goes, or changes its labels or taints (``ClusterState.node_epoch``). Per cycle
PreFilter then counts the matching pods per domain from the cluster state's index
(:mod:`..placed`, assumed pods and earlier members of the same gang included), and Filter is a
lookup per constraint per node: ``matching in the node's domain + (1 if the pod matches itself)
− the global minimum ≤ maxSkew``, the minimum taken as 0 while fewer domains than
``minDomains`` exist.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..framework import OK, SKIP, CycleState, PodChange, Slot, Status, fail
from ..labels import EVERYTHING
from ..model import Node, Pod
from ..placed import Condition, NodeCounts, Query
from ..state import ClusterState, NodeInfo
from ..terms import HOSTNAME, ZONE, SpreadConstraint
from . import node_affinity, taint_toleration

NAME = "PodTopologySpread"
MISMATCH = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = MISMATCH + " (missing required label)"
SYSTEM, LIST = "System", "List"
SYSTEM_DEFAULTS = (
    SpreadConstraint(3, HOSTNAME, hard=False, selector=EVERYTHING),
    SpreadConstraint(5, ZONE, hard=False, selector=EVERYTHING),
)
"""kube-scheduler's system default constraints (ScheduleAnyway: they only score)."""
NO_DOMAIN = 2**31 - 1
"""The global minimum when no node is a domain (kube-scheduler's math.MaxInt32)."""
IGNORED = -1
"""Score of a node lacking a topology key of the pod's own constraints (normalised to 0)."""


@dataclass(frozen=True)
class Args:
    """kube-scheduler's ``PodTopologySpreadArgs``."""

    defaulting: str = SYSTEM
    """System: :data:`SYSTEM_DEFAULTS`; List: :attr:`default_constraints`."""
    default_constraints: tuple[SpreadConstraint, ...] = ()
    """The List defaults (no selector of their own: each pod's comes from its workloads)."""


@dataclass(frozen=True)
class Domains:
    """One constraint's domains: the eligible nodes and their topology values."""

    value_of: Mapping[str, str]
    """eligible node → its value of the constraint's key."""
    values: frozenset[str]


@dataclass
class FilterState:
    constraints: tuple[SpreadConstraint, ...]
    counts: list[dict[str, int]]
    """Per constraint: value → matching pods on its eligible nodes (values with none left out)."""
    minimum: list[int]
    self_match: list[int]
    domains: list[Domains] = field(default_factory=list)
    """Per constraint: its domains (which nodes count, under which value)."""
    too_full: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    """Per constraint: its key and the values whose domain is at its limit (``matching + self
    − minimum > maxSkew``): what Filter checks, one lookup per node."""

    def finish(self) -> None:
        """Fill :attr:`too_full` from the counts."""
        self.too_full = []
        for c, counts, low, me in zip(
            self.constraints, self.counts, self.minimum, self.self_match, strict=True
        ):
            limit = c.max_skew + low - me
            self.too_full.append(
                (c.topology_key, frozenset(v for v, n in counts.items() if n > limit))
            )


_FILTER: Slot[FilterState] = Slot("PodTopologySpread/filter")


@dataclass
class ScoreState:
    constraints: tuple[SpreadConstraint, ...]
    ignored: set[str]
    counts: list[dict[str, int]]
    """Per constraint but hostname ones: value → matching pods on its eligible nodes."""
    per_node: list[NodeCounts]
    """Per hostname constraint: node → matching pods there."""
    weights: list[float]


_SCORE: Slot[ScoreState] = Slot("PodTopologySpread/score")


def eligible(pod: Pod, node: Node, c: SpreadConstraint) -> bool:
    """The node passes the constraint's node inclusion policies (``matchNodeInclusionPolicies``)."""
    if c.honor_affinity and not node_affinity.fits(pod, node):
        return False
    return not (c.honor_taints and taint_toleration.untolerated(pod, node) is not None)


def domains(
    pod: Pod, nodes: Mapping[str, NodeInfo], cons: tuple[SpreadConstraint, ...], require_all: bool
) -> list[Domains]:
    """Each constraint's domains over ``nodes``: with ``require_all`` only nodes having every
    constraint's key count (else a missing key is the value "", as kube-scheduler's System
    defaulting reads it)."""
    found: list[dict[str, str]] = [{} for _ in cons]
    for name, info in nodes.items():
        labels = info.node.label_map()
        if require_all and any(c.topology_key not in labels for c in cons):
            continue
        for i, c in enumerate(cons):
            if eligible(pod, info.node, c):
                found[i][name] = labels.get(c.topology_key, "")
    return [Domains(m, frozenset(m.values())) for m in found]


def query(pod: Pod, c: SpreadConstraint) -> Query:
    """The pods a constraint counts: the pod's namespace, its selector, none being deleted."""
    return Query((Condition(frozenset((pod.namespace,)), c.selector),), live_only=True)


def per_value(counts: NodeCounts, dom: Domains) -> dict[str, int]:
    out: dict[str, int] = {}
    for node, n in counts.items():
        value = dom.value_of.get(node)
        if value is not None:
            out[value] = out.get(value, 0) + n
    return out


def minimum(counts: dict[str, int], dom: Domains, min_domains: int) -> int:
    """The global minimum over the domains (0 while fewer than ``min_domains`` exist)."""
    if len(dom.values) < min_domains:
        return 0
    if not dom.values:
        return NO_DOMAIN
    if len(counts) < len(dom.values):  # a domain without any matching pod
        return 0
    return min(counts.values())


def moved(fs: FilterState, pod: Pod, changes: Sequence[PodChange]) -> FilterState:
    """``fs`` after pods were put on or taken off nodes (kube-scheduler's ``AddPod`` and
    ``RemovePod``, ``updateWithPod``): one counts where PreFilter would have counted it — of
    the pod's namespace, not being deleted, matching the constraint's selector, on one of its
    domains — and the global minimum follows. ``fs`` is not changed."""
    counts = [dict(c) for c in fs.counts]
    for other, node, by in changes:
        if other.uid == pod.uid or other.namespace != pod.namespace or other.deleting:
            continue
        labels = other.label_map()
        for i, c in enumerate(fs.constraints):
            value = fs.domains[i].value_of.get(node.name)
            if value is None or c.selector.empty or not c.selector.matches(labels):
                continue
            n = counts[i].get(value, 0) + by
            if n > 0:
                counts[i][value] = n
            else:
                counts[i].pop(value, None)
    low = [
        minimum(n, dom, c.min_domains)
        for c, n, dom in zip(fs.constraints, counts, fs.domains, strict=True)
    ]
    out = FilterState(fs.constraints, counts, low, fs.self_match, fs.domains)
    out.finish()
    return out


_MISSING = fail(MISSING_LABEL, unresolvable=True)
_MISMATCH = fail(MISMATCH)


def fits(fs: FilterState, labels: Mapping[str, str]) -> Status:
    """The Filter verdict on a node with ``labels``: the first constraint it breaks. A value
    no pod matches (not in the counts) is at 0, within every limit: limit = maxSkew + minimum −
    self ≥ 0 since maxSkew ≥ 1."""
    for key, full in fs.too_full:
        value = labels.get(key)
        if value is None:
            return _MISSING
        if value in full:
            return _MISMATCH
    return OK


def score_for(count: int, max_skew: int, weight: float) -> float:
    """kube-scheduler's ``scoreForCount``: skews within maxSkew are watered down."""
    return count * weight + (max_skew - 1)


def normalize_spread(scores: dict[str, int]) -> dict[str, int]:
    """Fewer matching pods is better: 100 × (max + min − score) / max; ignored nodes 0."""
    valid = [s for s in scores.values() if s != IGNORED]
    low, high = min(valid, default=0), max(valid, default=0)
    out = {}
    for n, s in scores.items():
        if s == IGNORED:
            out[n] = 0
        elif high == 0:
            out[n] = 100
        else:
            out[n] = 100 * (high + low - s) // high
    return out


class PodTopologySpread:
    NAME = NAME
    CROSS_NODE = True

    def __init__(self, args: Args, state: ClusterState) -> None:
        self.system = args.defaulting == SYSTEM
        self.defaults = SYSTEM_DEFAULTS if self.system else args.default_constraints
        self.state = state
        self._domains: dict[Hashable, list[Domains]] = {}
        self._epoch = -1

    def constraints(self, pod: Pod, hard: bool) -> tuple[SpreadConstraint, ...]:
        """The pod's own constraints of that kind, else the defaults of that kind with the
        selector its workloads give (none when they give none)."""
        if pod.spread:
            return tuple(c for c in pod.spread if c.hard == hard)
        chosen = [c for c in self.defaults if c.hard == hard]
        if not chosen:
            return ()
        selector = self.state.workloads.default_selector(pod)
        if selector.empty:
            return ()
        return tuple(replace(c, selector=selector) for c in chosen)

    def _domains_of(
        self, pod: Pod, cons: tuple[SpreadConstraint, ...], require_all: bool
    ) -> list[Domains]:
        if self._epoch != self.state.node_epoch or len(self._domains) > 64:
            self._domains.clear()
            self._epoch = self.state.node_epoch
        affinity = any(c.honor_affinity for c in cons)
        taints = any(c.honor_taints for c in cons)
        key = (
            tuple((c.topology_key, c.honor_affinity, c.honor_taints) for c in cons),
            require_all,
            (pod.node_selector, pod.required_terms) if affinity else None,
            pod.tolerations if taints else None,
        )
        found = self._domains.get(key)
        if found is None:
            found = self._domains[key] = domains(pod, self.state.nodes, cons, require_all)
        return found

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        cons = self.constraints(pod, hard=True)
        if not cons:
            return SKIP
        doms = self._domains_of(pod, cons, require_all=True)
        placed = self.state.placed
        fs = FilterState(cons, [], [], [], doms)
        for c, dom in zip(cons, doms, strict=True):
            # an empty selector counts no pod (countPodsMatchSelector), yet matches the pod
            counts = {} if c.selector.empty else per_value(placed.per_node(query(pod, c)), dom)
            fs.counts.append(counts)
            fs.minimum.append(minimum(counts, dom, c.min_domains))
            fs.self_match.append(1 if c.selector.matches(pod.label_map()) else 0)
        fs.finish()
        cs.write(_FILTER, fs)
        return OK

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        fs = cs.read(_FILTER)
        return OK if fs is None else fits(fs, info.node.label_map())

    def update_with_pods(self, cs: CycleState, pod: Pod, changes: Sequence[PodChange]) -> None:
        fs = cs.read(_FILTER)
        if fs is not None:
            cs.write(_FILTER, moved(fs, pod, changes))

    def pre_score(self, cs: CycleState, pod: Pod, nodes: list[NodeInfo]) -> Status:
        cons = self.constraints(pod, hard=False)
        if not cons or not self.state.nodes:
            return SKIP
        # nodes without a zone label still get hostname spreading under the System defaults
        require_all = bool(pod.spread) or not self.system
        ss = ScoreState(cons, set(), [], [], [])
        seen: list[set[str]] = [set() for _ in cons]
        for info in nodes:
            labels = info.node.label_map()
            if require_all and any(c.topology_key not in labels for c in cons):
                ss.ignored.add(info.node.name)
                continue
            for i, c in enumerate(cons):
                if c.topology_key != HOSTNAME:
                    seen[i].add(labels.get(c.topology_key, ""))
        doms = self._domains_of(pod, cons, require_all)
        placed = self.state.placed
        for i, c in enumerate(cons):
            counts = {} if c.selector.empty else placed.per_node(query(pod, c))
            size = len(seen[i])
            if c.topology_key == HOSTNAME:
                ss.per_node.append(counts)
                ss.counts.append({})
                size = len(nodes) - len(ss.ignored)
            else:
                ss.per_node.append({})
                ss.counts.append(per_value(counts, doms[i]))
            ss.weights.append(math.log(size + 2))
        cs.write(_SCORE, ss)
        return OK

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        ss = cs.read(_SCORE)
        if ss is None:
            return 0
        name = info.node.name
        if name in ss.ignored:
            return IGNORED
        labels = info.node.label_map()
        total = 0.0
        for i, c in enumerate(ss.constraints):
            value = labels.get(c.topology_key)
            if value is None:
                continue
            if c.topology_key == HOSTNAME:
                n = ss.per_node[i].get(name, 0)
            else:
                n = ss.counts[i].get(value, 0)
            total += score_for(n, c.max_skew, ss.weights[i])
        return math.floor(total + 0.5)  # Go's math.Round of a non-negative number

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        return normalize_spread(scores)


def new(args: Args, state: ClusterState) -> PodTopologySpread:
    return PodTopologySpread(args, state)
