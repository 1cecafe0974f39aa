"""AllocateHandshake: the device plugin can always tell which pod an Allocate is for.

The kubelet tells the device plugin no pod at Allocate or GetPreferredAllocation: only the
resource and a count of device IDs, in an order it does not promise. So this scheduler never has
two pods on one node whose allocations are pending (decided, not yet confirmed by the device
plugin's mark; :class:`~lj_runtimekit_scheduler.state.Pending`) and that share a (resource,
unit count) in any of their containers: a node holding such a pod is filtered out for the next
one until the device plugin confirms it (or it goes away), when the informer requeues the pods it
blocked. Pods with different requests go to one node at once.

A gang's members are not blocked by each other (they are placed together, all or nothing):
the scheduler binds a member after a same-request member on the same node only once that one is
confirmed (:func:`bind_after`; a member placed after the others, as one whose binding failed or
a PodGroup's pod beyond its minCount, waits for those of its gang still pending there). A basic
PodGroup is no gang here: its pods are placed one by one. Nodes whose inventory no device plugin
keeps (no pod there is ever marked: KWOK nodes of tests and benchmarks) are not checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..framework import OK, SKIP, CycleState, Slot, Status, fail
from ..gang import GangId, gang_of
from ..model import Pod, ResourceNames
from ..state import ClusterState, NodeInfo, Pending

NAME = "AllocateHandshake"

Units = frozenset[tuple[str, int]]
_ASKED: Slot[tuple[Units, GangId | None]] = Slot("AllocateHandshake/asked")
"""The pod's units and gang, computed once at PreFilter for every node's Filter."""


@dataclass(frozen=True)
class Args:
    names: ResourceNames = field(default_factory=ResourceNames)
    """The extended resource names, for the reason shown in FailedScheduling."""


def units_of(pod: Pod) -> Units:
    """(resource kind, count) of every device resource of every container of ``pod``."""
    return frozenset(u for d in pod.devices for u in d.units)


def blocker(
    uid: str, units: Units, gang: GangId | None, pending: Mapping[str, Pending]
) -> tuple[Pending, tuple[str, int]] | None:
    """The first pending pod (not ``uid``, not of its gang) sharing a (resource, count) with
    ``units``, and that request; None when the device plugin could tell them all apart."""
    for other_uid, p in pending.items():
        if other_uid == uid or (gang is not None and p.gang == gang):
            continue
        common = units & p.units
        if common:
            return p, min(common)
    return None


def bind_after(items: Sequence[tuple[Pod, str]], confirming: set[str]) -> list[list[str]]:
    """For pods placed together (a gang), in bind order: the uids each must wait for — the
    earlier ones on the same node sharing a (resource, count) with it — so at most one of
    them is pending on a node at a time. Nodes not in ``confirming`` never wait."""
    out: list[list[str]] = []
    for i, (pod, node) in enumerate(items):
        mine = units_of(pod)
        out.append(
            [p.uid for p, n in items[:i] if n == node and node in confirming and mine & units_of(p)]
            if mine
            else []
        )
    return out


class AllocateHandshake:
    NAME = NAME

    def __init__(self, names: ResourceNames, state: ClusterState | None = None) -> None:
        self.names = names
        self.state = state
        """Nodes in DRA mode confirm nothing: the kubelet prepares a claim there."""

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        units = units_of(pod)
        if not units:
            return SKIP
        cs.write(_ASKED, (units, self._gang(pod)))
        return OK

    def _gang(self, pod: Pod) -> GangId | None:
        gid = gang_of(pod)
        group = self.state.group_of(gid) if self.state is not None else None
        return None if group is not None and not group.gang else gid

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        if not info.confirms or not info.pending:
            return OK
        if self.state is not None and self.state.dra.serves(info.node.name):
            return OK
        units, gang = cs.read(_ASKED) or (units_of(pod), self._gang(pod))
        found = blocker(pod.uid, units, gang, info.pending)
        if found is None:
            return OK
        other, (kind, n) = found
        # unresolvable for preemption: the confirmation comes within seconds, evicting the pod
        # it waits for would only lose that pod
        return fail(
            f"waiting for the device plugin on {info.node.name} to confirm pod {other.pod}'s "
            f"devices (same request {self.names.of(kind)}={n})",
            unresolvable=True,
        )


def new(args: Args, state: ClusterState | None = None) -> AllocateHandshake:
    return AllocateHandshake(args.names, state)
