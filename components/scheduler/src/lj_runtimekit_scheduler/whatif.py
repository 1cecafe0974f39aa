"""What-if copies of nodes: some pods taken off, others put on, the cluster state untouched.

Preemption's dry runs filter a pod against a node as it would be without its victims, and every
cycle filters against a node as it will be once the pods nominated there (by a preemption) are
bound (kube-scheduler's ``RunFilterPluginsWithNominatedPods``). A copy is a new
:class:`~.state.NodeInfo` with a version of its own (negative, never reused), so no cache keyed
by node version mistakes it for the real node; the pods it holds that the state does not are its
``guests``.

The plugins whose verdict depends on pods of other nodes (InterPodAffinity, PodTopologySpread)
and VolumeRestrictions computed their state in PreFilter from the cluster state; what a copy
changes reaches them as :data:`Change` s (pod, node, ±1), which they apply to that state
(kube-scheduler's PreFilterExtensions ``AddPod``/``RemovePod``): :meth:`Sandbox.trial` gives
both, the copy and every change the sandbox made so far.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace

from .gpu import Choice, apply
from .model import DeviceUse, Pod
from .state import ClusterState, NodeInfo

_versions = itertools.count(-1, -1)

Placed = tuple[Pod, Choice | None]
Change = tuple[Pod, str, int]
"""A pod put on (+1) or taken off (-1) the node of that name."""


def _copy(
    info: NodeInfo, pods: dict[str, Placed], removed: Iterable[str], added: Sequence[Placed]
) -> NodeInfo:
    """``info`` with ``removed`` taken off and ``added`` put on; ``pods`` is what each pod on it
    holds (uid → pod, its devices)."""
    gone = set(removed) & info.pods
    requested = dict(info.requested)
    for uid in gone:
        for k, v in pods[uid][0].requests.items():
            requested[k] = requested.get(k, 0) - v
    for pod, _ in added:
        for k, v in pod.requests.items():
            requested[k] = requested.get(k, 0) + v
    kept = info.pods - gone
    ports = {p for uid in kept for p in pods[uid][0].host_ports} if gone else set(info.ports)
    for pod, _ in added:
        ports.update(pod.host_ports)
    uses: dict[str, DeviceUse] = dict(info.device_use)
    if gone:  # recount from the pods left, as the state does when a pod gives its devices back
        uses = {}
        for uid in kept:
            if (choice := pods[uid][1]) is not None:
                uses = apply(uses, choice)
    for _, choice in added:
        if choice is not None:
            uses = apply(uses, choice)
    guests = {u: p for u, p in info.guests.items() if u not in gone}
    guests.update((pod.uid, pod) for pod, _ in added)
    return replace(
        info,
        requested=requested,
        ports=ports,
        device_use=uses,
        pods=kept | {p.uid for p, _ in added},
        pending={u: p for u, p in info.pending.items() if u not in gone},
        version=next(_versions),
        guests=guests,
    )


class Sandbox:
    """Nodes of the cluster as they would be after some pods are evicted and others placed.

    Guarantees: the :class:`ClusterState` and its NodeInfos are never changed; a node nothing
    was done to is served as the real NodeInfo; every copy served is a fresh object.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._infos: dict[str, NodeInfo] = {}
        self._placed: dict[str, Placed] = {}
        """Pods put on nodes here (not in the state)."""
        self._on: dict[str, str] = {}
        """uid → the node each pod of :attr:`_placed` was put on."""
        self._removed: dict[str, tuple[Pod, str]] = {}
        """uid → (pod, node) of the pods taken off for good here."""

    def _holding(self, info: NodeInfo) -> dict[str, Placed]:
        out: dict[str, Placed] = {}
        for uid in info.pods:
            if uid in self._placed:
                out[uid] = self._placed[uid]
            elif (held := self.state.pods.get(uid)) is not None:
                out[uid] = (held[0], held[2])
        return out

    def info(self, node: str) -> NodeInfo:
        """The node as it is here."""
        return self._infos.get(node) or self.state.nodes[node]

    def without(self, node: str, uids: Iterable[str]) -> NodeInfo:
        """A copy of the node as it is here with ``uids`` taken off too (a trial; uids of other
        nodes are not its concern)."""
        info = self.info(node)
        return _copy(info, self._holding(info), uids, ())

    def changes(self, off: Iterable[str] = ()) -> list[Change]:
        """Every pod this sandbox took off or put on, then the pods ``off`` (wherever the state
        has them, those taken off already apart) taken off too."""
        out: list[Change] = [(p, n, -1) for p, n in self._removed.values()]
        out.extend((self._placed[u][0], n, 1) for u, n in self._on.items())
        for uid in off:
            if uid in self._removed or uid in self._on:
                continue
            if (held := self.state.pods.get(uid)) is not None:
                out.append((held[0], held[1], -1))
        return out

    def trial(self, node: str, off: Iterable[str] = ()) -> tuple[NodeInfo, list[Change]]:
        """The node as it is here with the pods ``off`` taken off too, and what that and the
        sandbox change for the plugins that look beyond the node (:meth:`changes`): ``off``
        may name pods of other nodes (a gang victim's members elsewhere)."""
        off = set(off)
        return self.without(node, off), self.changes(off)

    def remove(self, node: str, uids: Iterable[str]) -> None:
        """Take ``uids`` off ``node`` for good (in this sandbox)."""
        info = self.info(node)
        uids = set(uids) & info.pods
        if uids:
            holding = self._holding(info)
            for uid in uids:
                self._removed[uid] = (holding[uid][0], node)
            self._infos[node] = _copy(info, holding, uids, ())

    def place(self, pod: Pod, node: str, choice: Choice | None) -> None:
        """Put ``pod`` on ``node`` with ``choice`` (in this sandbox)."""
        info = self.info(node)
        self._placed[pod.uid] = (pod, choice)
        self._on[pod.uid] = node
        self._infos[node] = _copy(info, self._holding(info), (), [(pod, choice)])


def nominated_for(state: ClusterState, pod: Pod, info: NodeInfo) -> list[Placed]:
    """The pods nominated to ``info``'s node that ``pod`` must leave room for: those of its
    priority or higher, itself and any the copy already holds excepted."""
    on = state.nominated_on.get(info.node.name)
    if not on:
        return []
    return [
        (n.pod, n.choice)
        for uid, n in on.items()
        if uid != pod.uid and n.pod.priority >= pod.priority and uid not in info.pods
    ]


def with_nominated(state: ClusterState, pod: Pod, info: NodeInfo) -> NodeInfo | None:
    """``info`` with :func:`nominated_for` put on; None when there are none."""
    held = nominated_for(state, pod, info)
    return _copy(info, {}, (), held) if held else None
