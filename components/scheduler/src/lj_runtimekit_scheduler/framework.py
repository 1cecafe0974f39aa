"""The scheduling cycle in the shape of the Kubernetes Scheduler Framework. No I/O here:
binding writes go through the :class:`Binder` the app provides."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

import structlog

from .errors import SchedulerError
from .gang import gang_of
from .gpu import Choice
from .model import Node, Pod
from .state import ClusterState, NodeInfo
from .whatif import Change, nominated_for, with_nominated

T = TypeVar("T")
log = structlog.get_logger("lj_runtimekit_scheduler.framework")


class Slot(Generic[T]):
    """A typed key of :class:`CycleState` (kube-scheduler's ``StateKey``, with the type the
    checker knows): what one plugin writes in a cycle and others read, by its type."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Slot({self.name!r})"


CHOSEN_DEVICES: Slot[dict[str, Choice]] = Slot("GpuFit/chosen")
"""Node → the devices GpuFit chose there for the pod: scored by GpuTopology, assumed by the
scheduler, written on the pod at PreBind."""


@dataclass
class CycleState:
    """Scratch space of one pod's cycle, shared by its plugins through typed :class:`Slot`
    keys."""

    _slots: dict[Slot[Any], object] = field(default_factory=dict)
    binding_annotations: dict[str, str] = field(default_factory=dict)
    """Annotations PreBind plugins want on the pod; the apiserver copies a Binding's annotations
    onto the pod it binds, so they land in the bind request itself: one write per pod, and the
    pod is never seen bound without them."""

    def read(self, slot: Slot[T]) -> T | None:
        """What was written under ``slot`` in this cycle (None: nothing)."""
        return cast("T | None", self._slots.get(slot))

    def write(self, slot: Slot[T], value: T) -> None:
        self._slots[slot] = value

    def setdefault(self, slot: Slot[T], value: T) -> T:
        """The value under ``slot``, writing ``value`` first when there is none."""
        return cast(T, self._slots.setdefault(slot, value))

    def chosen(self, node: str) -> Choice | None:
        """The devices chosen for the pod on ``node`` in this cycle (None: no device pod, or
        GpuFit not in the profile)."""
        return (self.read(CHOSEN_DEVICES) or {}).get(node)

    def clone(self) -> CycleState:
        """A copy whose slots can be replaced without touching these (kube-scheduler's
        ``CycleState.Clone``); the values themselves are shared, never changed in place."""
        return CycleState(dict(self._slots), dict(self.binding_annotations))


@dataclass(frozen=True)
class Status:
    """A plugin's verdict; ``reason`` is shown in FailedScheduling."""

    ok: bool = True
    reason: str = ""
    unresolvable: bool = False
    """From PreFilter: no change in the cluster would help (e.g. an unsupported feature). From
    Filter: evicting pods would not help there (kube-scheduler's UnschedulableAndUnresolvable:
    preemption leaves the node out)."""
    skip: bool = False
    """From PreFilter: this plugin's Filter has nothing to check for this pod (kube-scheduler's
    Skip status); the cycle does not call it on any node."""
    nodes: frozenset[str] | None = None
    """From PreFilter: only these nodes can pass (kube-scheduler's PreFilterResult.NodeNames);
    the others are not evaluated. None: any node."""


OK = Status()
SKIP = Status(skip=True)


def fail(reason: str, unresolvable: bool = False) -> Status:
    return Status(False, reason, unresolvable)


class Plugin(Protocol):
    """What every plugin has: its name in the registry and the config. The extension points it
    implements are the protocols below."""

    @property
    def NAME(self) -> str: ...


@runtime_checkable
class PreFilterPlugin(Protocol):
    NAME: str

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status: ...


@runtime_checkable
class FilterPlugin(Protocol):
    NAME: str

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status: ...


PodChange = tuple[Pod, Node, int]
"""A pod put on (+1) or taken off (-1) a node, seen by :class:`PreFilterExtensions`."""


@runtime_checkable
class PreFilterExtensions(Protocol):
    """A plugin whose PreFilter state counts pods (kube-scheduler's ``PreFilterExtensions``,
    ``AddPod``/``RemovePod`` in one call): filtering a what-if copy of a node — its nominated
    pods on it, a preemption's victims off — gives it the pods moved, so its Filter sees the
    cluster as the copy has it, on every node. It replaces its state in ``cs`` (a clone: the
    value read is shared with the cycle's own state and is never changed in place)."""

    NAME: str

    def update_with_pods(self, cs: CycleState, pod: Pod, changes: Sequence[PodChange]) -> None: ...


@runtime_checkable
class PostFilterPlugin(Protocol):
    NAME: str

    def post_filter(
        self, cs: CycleState, pod: Pod, reasons: dict[str, str], filtering: Filtering
    ) -> Status:
        """After no node passed Filter (``reasons``: node → why); ``filtering`` runs the cycle's
        Filter chain on what-if copies of a node. The reason of a failing status is appended to
        FailedScheduling (``preemption: ...``)."""
        ...


@runtime_checkable
class PreScorePlugin(Protocol):
    NAME: str

    def pre_score(self, cs: CycleState, pod: Pod, nodes: list[NodeInfo]) -> Status: ...


@runtime_checkable
class ScorePlugin(Protocol):
    NAME: str

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int: ...


@runtime_checkable
class NormalizeScorePlugin(Protocol):
    NAME: str

    def normalize(self, scores: dict[str, int]) -> dict[str, int]: ...


@runtime_checkable
class ReservePlugin(Protocol):
    NAME: str

    def reserve(self, cs: CycleState, pod: Pod, node: str) -> Status: ...

    def unreserve(self, cs: CycleState, pod: Pod, node: str) -> None: ...


@runtime_checkable
class PermitPlugin(Protocol):
    NAME: str

    def permit(self, cs: CycleState, pod: Pod, node: str) -> Status: ...


@runtime_checkable
class PreBindPlugin(Protocol):
    NAME: str

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status: ...


@runtime_checkable
class BindPlugin(Protocol):
    NAME: str

    async def bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status: ...


class Binder(Protocol):
    """The apiserver write the cycle needs (implemented in ``kube.py``)."""

    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None: ...


@runtime_checkable
class ClaimWriter(Protocol):
    """The writes of a pod's claim on a node in DRA mode (plugins/dra_claims.py; ``kube.py``)."""

    async def create_claim(self, claim: dict[str, Any]) -> dict[str, Any]: ...

    async def claim_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...

    async def pod_status(self, pod: Pod, patch: dict[str, Any]) -> None: ...

    async def delete_claim(self, namespace: str, name: str) -> None: ...


def cross_node(plugin: object) -> bool:
    """Whether a plugin's Filter verdict or Score on a node depends on pods on *other* nodes
    (it says so with ``CROSS_NODE = True``, as InterPodAffinity and PodTopologySpread do), or
    on the set of feasible nodes (it has a PreScore). The Profile never remembers such a
    plugin's verdict or score across cycles: a pod landing anywhere may change it."""
    return getattr(plugin, "CROSS_NODE", False) is True or isinstance(plugin, PreScorePlugin)


def normalize_max(scores: dict[str, int]) -> dict[str, int]:
    """Scale to 0-100 by the best node (kube-scheduler's DefaultNormalizeScore)."""
    top = max(scores.values(), default=0)
    if top <= 0:
        return dict.fromkeys(scores, 0)
    return {k: v * 100 // top for k, v in scores.items()}


def feasible_to_find(nodes: int) -> int:
    """kube-scheduler's adaptive percentageOfNodesToScore: stop filtering after this many
    feasible nodes (all below 100 nodes; 50 % minus 1 % per 125 nodes, at least 5 %, at least
    100), starting each cycle where the last one stopped so every node gets its turn."""
    if nodes < 100:
        return nodes
    pct = max(5, 50 - nodes // 125)
    return max(100, nodes * pct // 100)


Scores = tuple[int, ...]
Verdict = tuple[str | None, Scores]
"""One node for one pod shape: the first failing Filter's reason (None: feasible) and the raw
score of every Score plugin that is not :func:`cross_node`, in profile order."""


@dataclass
class Walk:
    """One cycle's pass over the nodes."""

    filters: list[Any]
    """This cycle's Filter plugins whose verdict depends on the node alone (remembered)."""
    cross: list[Any]
    """This cycle's :func:`cross_node` Filter plugins: run on every node walked, in every
    cycle; a node they reject gets the node-local verdict only when it matters (no node is
    feasible), so its reason is the first failing Filter's in profile order."""
    shape: int
    feasible: list[NodeInfo] = field(default_factory=list)
    raw: list[Scores] = field(default_factory=list)
    fresh: set[str] = field(default_factory=set)
    """Nodes evaluated in this cycle (their per-cycle plugin state is in the CycleState)."""
    volatile: bool = False
    """The pod's verdicts depend on more than its node (its claims: PVs and PVCs); nothing is
    remembered for it."""
    reasons: dict[str, str] = field(default_factory=dict)


def shape(pod: Pod) -> Hashable:
    """Everything of a pod the Filter and Score plugins read; equal shapes get equal verdicts
    on an unchanged node. The gang is part of it: a gang's members do not block each other
    (AllocateHandshake), so one gang's verdict on a node is not another's."""
    return (
        gang_of(pod),
        tuple(sorted(pod.requests.items())),
        pod.devices,
        pod.host_ports,
        pod.node_name,
        pod.node_selector,
        pod.required_terms,
        pod.preferred_terms,
        pod.tolerations,
        pod.priority,  # which nominated pods it must leave room for (whatif.with_nominated)
        pod.volumes,
    )


@dataclass(frozen=True)
class Result:
    node: str | None
    reasons: dict[str, str]
    """node → the first failing plugin's reason (or ``"*"`` for a pod-level reason); when a
    node was found, a node a cross-node plugin rejected may carry that plugin's reason."""
    unresolvable: bool = False
    post_filter: str = ""
    """What the PostFilter plugins said (``preemption: ...``), appended to FailedScheduling."""


@dataclass(frozen=True)
class PreFiltered:
    """What one pod's PreFilter leaves its Filter."""

    active: list[Any]
    """The Filter plugins the cycle runs, in profile order (those whose PreFilter said Skip
    left out)."""
    allowed: frozenset[str] | None = None
    """The only nodes that can pass (the PreFilter results' intersection); None: any."""
    narrowed: list[str] = field(default_factory=list)
    """The PreFilter plugins that narrowed the nodes."""


_NONE: frozenset[str] = frozenset()


def extended(
    cs: CycleState, pod: Pod, plugins: Sequence[Any], changes: Sequence[PodChange]
) -> CycleState:
    """``cs`` as the :class:`PreFilterExtensions` among ``plugins`` see it after ``changes``: a
    clone they updated, or ``cs`` itself when nothing changes for them."""
    if not changes or not plugins:
        return cs
    out = cs.clone()
    for p in plugins:
        p.update_with_pods(out, pod, changes)
    return out


def first_failure(
    cs: CycleState,
    moved: CycleState,
    pod: Pod,
    info: NodeInfo,
    filters: Sequence[Any],
    *,
    extending: frozenset[str],
) -> Status:
    """The first failing Filter on ``info`` (its reason ``"<plugin>: <why>"``), else OK; the
    plugins named in ``extending`` read ``moved`` (their state after the copy's changes), the
    others ``cs`` (so what GpuFit chooses lands in the cycle's own state)."""
    for f in filters:
        st = f.filter(moved if f.NAME in extending else cs, pod, info)
        if not st.ok:
            return Status(False, f"{f.NAME}: {st.reason}", st.unresolvable)
    return OK


class Filtering:
    """The Filter chain of one pod's cycle (its PreFilter done), for a PostFilter plugin to run
    on what-if copies of nodes (kube-scheduler's ``RunFilterPluginsWithNominatedPods``)."""

    def __init__(self, cs: CycleState, pod: Pod, pre: PreFiltered, state: ClusterState) -> None:
        self.cs, self.pod, self.state = cs, pod, state
        self.filters, self.allowed = pre.active, pre.allowed
        self.extensions = [f for f in pre.active if isinstance(f, PreFilterExtensions)]
        self._extending = frozenset(f.NAME for f in self.extensions)

    def _moves(self, changes: Sequence[Change]) -> list[PodChange]:
        out = []
        for pod, node, delta in changes:
            if (info := self.state.nodes.get(node)) is not None:
                out.append((pod, info.node, delta))
        return out

    def run(self, info: NodeInfo, changes: Sequence[Change] = ()) -> Status:
        """The first failing filter on ``info`` (its reason ``"<plugin>: <why>"``), else OK;
        then the same on ``info`` with the pods nominated there that this pod must leave room
        for, so the devices GpuFit chose last (``cs.chosen``) are those it would get.
        ``changes`` are what made ``info`` a what-if copy (and any other node's pods moved with
        it: a sandbox's, :meth:`whatif.Sandbox.trial`); the plugins that count pods beyond the
        node see them. A node the PreFilter results left out fails for good (kube-scheduler:
        unresolvable)."""
        if self.allowed is not None and info.node.name not in self.allowed:
            return Status(False, "node(s) didn't satisfy the pod's PreFilter", True)
        moves = self._moves(changes)
        moved = extended(self.cs, self.pod, self.extensions, moves)
        st = first_failure(self.cs, moved, self.pod, info, self.filters, extending=self._extending)
        if not st.ok:
            return st
        held = nominated_for(self.state, self.pod, info)
        if not held:
            return OK
        view = with_nominated(self.state, self.pod, info)
        assert view is not None
        nominated = [(p, info.node, 1) for p, _ in held]
        moved = extended(moved, self.pod, self.extensions, nominated)
        return first_failure(
            self.cs, moved, self.pod, view, self.filters, extending=self._extending
        )


class Profile:
    """The enabled plugins, by extension point, with their weights."""

    def __init__(self, plugins: list[tuple[Plugin, int]]) -> None:
        self.names = tuple(p.NAME for p, _ in plugins)
        """The plugins' names, in profile order."""
        self.pre_filter = [p for p, _ in plugins if isinstance(p, PreFilterPlugin)]
        self.filter = [p for p, _ in plugins if isinstance(p, FilterPlugin)]
        self.post_filter = [p for p, _ in plugins if isinstance(p, PostFilterPlugin)]
        self.pre_score = [p for p, _ in plugins if isinstance(p, PreScorePlugin)]
        self.score = [(p, w) for p, w in plugins if isinstance(p, ScorePlugin) and w > 0]
        self._cross = {p.NAME for p, _ in plugins if cross_node(p)}
        """Names of the :func:`cross_node` plugins."""
        self._extending = frozenset(
            p.NAME for p, _ in plugins if isinstance(p, PreFilterExtensions)
        )
        """Names of the :class:`PreFilterExtensions` plugins."""
        self._remembered = [k for k, (p, _) in enumerate(self.score) if p.NAME not in self._cross]
        """Indices in :attr:`score` of the plugins whose raw score is remembered per node."""
        self.reserve = [p for p, _ in plugins if isinstance(p, ReservePlugin)]
        self.permit = [p for p, _ in plugins if isinstance(p, PermitPlugin)]
        self.pre_bind = [p for p, _ in plugins if isinstance(p, PreBindPlugin)]
        self.bind = [p for p, _ in plugins if isinstance(p, BindPlugin)]
        # isinstance on a runtime-checkable Protocol walks its attributes: decide once
        self._normalize = [
            p.normalize if isinstance(p, NormalizeScorePlugin) else None for p, _ in self.score
        ]
        self._next_start = 0
        self._cycles = 0
        self.sampled = True
        """Whether this cycle's plugin durations are observed (as kube-scheduler, a sample)."""
        self._shapes: dict[Hashable, int] = {}
        """Pod shape → a small number (hashing a shape once per cycle, not once per node)."""
        self._memo: dict[str, tuple[NodeInfo, int, dict[int, Verdict]]] = {}
        """node name → (its NodeInfo, that one's version, pod shape → verdict); a new version
        drops the old verdicts."""
        self.observe: Callable[[str, str, float], None] = lambda point, name, s: None
        self.sample_every = 10
        """Plugin durations are observed in one cycle of this many (kube-scheduler: 10 %)."""
        self._state: ClusterState | None = None
        """The state of the cycle running, while it has nominated pods (else None)."""

    def _timed(self, point: str, name: str, t0: float) -> None:
        if self.sampled:
            self.observe(point, name, time.perf_counter() - t0)

    def _scores(self, cs: CycleState, pod: Pod, info: NodeInfo, spent: list[float]) -> Scores:
        out = []
        for k in self._remembered:
            t0 = time.perf_counter()
            out.append(self.score[k][0].score(cs, pod, info))
            spent[k] += time.perf_counter() - t0
        return tuple(out)

    def _evaluate(
        self, cs: CycleState, pod: Pod, info: NodeInfo, filters: list[Any], spent: list[float]
    ) -> Verdict:
        """The node-local Filter chain on one node, then (when it passes) the remembered
        Score plugins. A node where pods are nominated that this one must leave room for is
        filtered once more with them on it (kube-scheduler's ``RunFilterPluginsWithNominatedPods``;
        the node's version moves with its nominations, and the pod's priority is part of its
        shape)."""
        st = self._with_nominated(cs, pod, info, filters)
        if not st.ok:
            return (st.reason, ())
        return (None, self._scores(cs, pod, info, spent))

    def _with_nominated(
        self, cs: CycleState, pod: Pod, info: NodeInfo, filters: Sequence[Any]
    ) -> Status:
        """``filters`` on the node, then on the node with the pods nominated there that this
        pod must leave room for, the plugins that count pods seeing them too."""
        st = first_failure(cs, cs, pod, info, filters, extending=_NONE)
        if not st.ok or self._state is None:
            return st
        held = nominated_for(self._state, pod, info)
        if not held:
            return st
        view = with_nominated(self._state, pod, info)
        assert view is not None
        counting = [f for f in filters if f.NAME in self._extending]
        moved = extended(cs, pod, counting, [(p, info.node, 1) for p, _ in held])
        return first_failure(cs, moved, pod, view, filters, extending=self._extending)

    def _verdict(
        self, cs: CycleState, pod: Pod, info: NodeInfo, walk: Walk, spent: list[float]
    ) -> Verdict:
        name = info.node.name
        if walk.volatile:  # its claims' PVs and PVCs are not the node's: nothing is remembered
            walk.fresh.add(name)
            return self._evaluate(cs, pod, info, walk.filters, spent)
        known = self._memo.get(name)
        if known is None or known[0] is not info or known[1] != info.version:
            # a node removed and added again is a new NodeInfo whose version starts over
            known = self._memo[name] = (info, info.version, {})
        verdict = known[2].get(walk.shape)
        if verdict is None:
            verdict = known[2][walk.shape] = self._evaluate(cs, pod, info, walk.filters, spent)
            walk.fresh.add(name)
        return verdict

    def _walk(
        self, cs: CycleState, pod: Pod, state: ClusterState, names: list[str] | None, walk: Walk
    ) -> None:
        """Filter nodes from where the last cycle stopped until enough are feasible."""
        spent = [0.0] * len(self.score)
        t0 = time.perf_counter()
        if names is None:
            infos = list(state.nodes.values())
            want = feasible_to_find(len(infos))
            start = self._next_start % len(infos) if infos else 0
        else:
            infos = [state.nodes[n] for n in names if n in state.nodes]
            want, start = len(infos), 0
        seen = 0
        # A node a cross-node Filter rejects (one lookup from its PreFilter) is not evaluated
        # further unless no node is feasible: then the reasons must be the first failing
        # Filter's in profile order, the node's own Filters first.
        deferred: list[tuple[NodeInfo, str]] = []
        for i in range(len(infos)):
            info = infos[(start + i) % len(infos)]
            seen += 1
            if walk.cross:
                st = self._with_nominated(cs, pod, info, walk.cross)
                if not st.ok:
                    deferred.append((info, st.reason))
                    continue
            reason, scores = self._verdict(cs, pod, info, walk, spent)
            if reason is not None:
                walk.reasons[info.node.name] = reason
                continue
            walk.feasible.append(info)
            walk.raw.append(scores)
            if len(walk.feasible) >= want:
                break
        for info, crossed in deferred:
            if walk.feasible:
                walk.reasons[info.node.name] = crossed
            else:
                reason, _ = self._verdict(cs, pod, info, walk, spent)
                walk.reasons[info.node.name] = reason or crossed
        if names is None and infos:
            self._next_start = (start + seen) % len(infos)
        self._timed("Filter", "all", t0)
        if self.sampled:
            for k in self._remembered:  # the cross-node ones are timed where they run
                self.observe("Score", self.score[k][0].NAME, spent[k])

    def pre_filter_all(self, cs: CycleState, pod: Pod) -> Status | PreFiltered:
        """PreFilter: its first failure (reason ``"<plugin>: <why>"``), else what the cycle's
        Filter runs with (the plugins whose PreFilter said Skip left out, the nodes its
        PreFilter results allow)."""
        skipped: set[str] = set()
        allowed: frozenset[str] | None = None
        narrowed: list[str] = []
        for p in self.pre_filter:
            t0 = time.perf_counter()
            st = p.pre_filter(cs, pod)
            self._timed("PreFilter", p.NAME, t0)
            if not st.ok:
                return Status(False, f"{p.NAME}: {st.reason}", st.unresolvable)
            if st.skip:
                skipped.add(p.NAME)
            if st.nodes is not None:
                allowed = st.nodes if allowed is None else allowed & st.nodes
                narrowed.append(p.NAME)
        active = [f for f in self.filter if f.NAME not in skipped] if skipped else self.filter
        return PreFiltered(active, allowed, narrowed)

    def filtering(self, cs: CycleState, pod: Pod, state: ClusterState) -> Filtering | Status:
        """The pod's Filter chain after its PreFilter (for dry runs: a gang's preemption), or the
        PreFilter failure."""
        pre = self.pre_filter_all(cs, pod)
        return pre if isinstance(pre, Status) else Filtering(cs, pod, pre, state)

    def find_node(
        self,
        cs: CycleState,
        pod: Pod,
        state: ClusterState,
        names: list[str] | None = None,
        *,
        post_filter: bool = True,
    ) -> Result:
        """PreFilter → Filter → (PostFilter) → PreScore → Score/Normalize: the best node.

        Filter verdicts and raw scores are remembered per node, per node version (which moves on
        every change of the node or of the pods and devices it holds) and per pod shape
        (:func:`shape`), so a run of same-shaped pods — a Job's or a Deployment's replicas —
        evaluates only the nodes that changed since the last one. The winner is evaluated again
        in this cycle when its verdict was remembered, so plugins that keep per-cycle state
        (GpuFit's device choice) have it. Plugins whose verdict depends on pods of other nodes
        (:func:`cross_node`) are never remembered: their Filter runs, after the node's own
        ones, on every node those pass, and their Score on every feasible node, each cycle,
        from what their PreFilter/PreScore computed once for the cycle. Nothing is remembered
        for a pod with claims (its verdicts depend on PVs and PVCs, not on its node alone), and
        a PreFilter's node set narrows the walk to those nodes.
        """
        self._cycles += 1
        self.sampled = (self._cycles - 1) % self.sample_every == 0  # first cycle sampled
        pre = self.pre_filter_all(cs, pod)
        if isinstance(pre, Status):
            return Result(None, {"*": pre.reason}, pre.unresolvable)
        self._state = state if state.nominated else None
        allowed, narrowed = pre.allowed, pre.narrowed
        filters = [f for f in pre.active if f.NAME not in self._cross]
        cross = [f for f in pre.active if f.NAME in self._cross]
        key = shape(pod)
        if len(self._shapes) > 10_000:  # many distinct shapes: start over rather than grow
            self._shapes.clear()
            self._memo.clear()
        walk = Walk(filters, cross, self._shapes.setdefault(key, len(self._shapes)))
        walk.volatile = bool(pod.claims)
        among = names
        if allowed is not None:
            among = sorted(allowed if names is None else allowed.intersection(names))
        self._walk(cs, pod, state, among, walk)
        feasible = walk.feasible
        if not feasible and allowed is not None:
            # kube-scheduler's words for the nodes a PreFilter result left out
            why = f"{narrowed[0]}: node(s) didn't satisfy plugin(s) [{' '.join(sorted(narrowed))}]"
            for n in names if names is not None else state.nodes:
                if n not in allowed:
                    walk.reasons.setdefault(n, why)
        if not feasible:
            said = []
            if post_filter:
                filtering = Filtering(cs, pod, pre, state)
                for pf in self.post_filter:
                    t0 = time.perf_counter()
                    st = pf.post_filter(cs, pod, walk.reasons, filtering)
                    self._timed("PostFilter", pf.NAME, t0)
                    if st.reason:
                        said.append(st.reason)
            return Result(None, walk.reasons, post_filter=" ".join(said))
        best = feasible[0].node.name
        if len(feasible) > 1 and self.score:
            best = self._best(cs, pod, walk)
        if best not in walk.fresh:
            self._evaluate(cs, pod, state.nodes[best], filters, [0.0] * len(self.score))
        return Result(best, walk.reasons)

    def _best(self, cs: CycleState, pod: Pod, walk: Walk) -> str:
        """PreScore, the cross-node Scores, Normalize and the weighted sum over the feasible
        nodes: the winner (ties: the node name)."""
        feasible = walk.feasible
        skipped: set[str] = set()
        for ps in self.pre_score:
            t0 = time.perf_counter()
            if ps.pre_score(cs, pod, feasible).skip:
                skipped.add(ps.NAME)
            self._timed("PreScore", ps.NAME, t0)
        position = {k: i for i, k in enumerate(self._remembered)}
        total = dict.fromkeys((i.node.name for i in feasible), 0)
        for k, (sp, weight) in enumerate(self.score):
            if sp.NAME in skipped:
                continue
            if k in position:
                i = position[k]
                scores = {info.node.name: r[i] for info, r in zip(feasible, walk.raw, strict=True)}
            else:
                t0 = time.perf_counter()
                scores = {info.node.name: sp.score(cs, pod, info) for info in feasible}
                self._timed("Score", sp.NAME, t0)
            normalize = self._normalize[k]
            norm = normalize(scores) if normalize else scores
            for n, v in norm.items():
                total[n] += weight * v
        return max(total.items(), key=lambda kv: (kv[1], kv[0]))[0]

    def reserve_all(self, cs: CycleState, pod: Pod, node: str) -> Status:
        done: list[ReservePlugin] = []
        for p in self.reserve:
            st = p.reserve(cs, pod, node)
            if not st.ok:
                for q in reversed(done):
                    q.unreserve(cs, pod, node)
                return fail(f"{p.NAME}: {st.reason}")
            done.append(p)
        return OK

    def unreserve_all(self, cs: CycleState, pod: Pod, node: str) -> None:
        for p in reversed(self.reserve):
            p.unreserve(cs, pod, node)

    def permit_all(self, cs: CycleState, pod: Pod, node: str) -> Status:
        for p in self.permit:
            st = p.permit(cs, pod, node)
            if not st.ok:
                return fail(f"{p.NAME}: {st.reason}")
        return OK

    async def bind_all(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        """PreBind then Bind; the first failure (a refusing Status, or the apiserver's error a
        plugin raised) as kube-scheduler words it: ``running Bind plugin "DefaultBinder": ...``."""
        steps: list[tuple[str, str, Callable[..., Awaitable[Status]]]] = [
            *(("PreBind", p.NAME, p.pre_bind) for p in self.pre_bind),
            *(("Bind", p.NAME, p.bind) for p in self.bind[:1]),
        ]
        for point, name, step in steps:
            try:
                st = await step(cs, pod, node, binder)
            except SchedulerError as e:
                st = fail(str(e))
            except Exception as e:
                # a plugin's bug: told on the pod and logged, never left to end the bind task
                log.exception("plugin_failed", extension_point=point, plugin=name, pod=pod.key)
                st = fail(f"unexpected error, see the scheduler's log: {e!r}"[:500])
            if not st.ok:
                return fail(f'running {point} plugin "{name}": {st.reason}', st.unresolvable)
        return OK
