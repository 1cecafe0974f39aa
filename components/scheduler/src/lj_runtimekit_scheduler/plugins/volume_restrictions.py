"""VolumeRestrictions: a ReadWriteOncePod claim is used by one pod, and in-tree disks are not
mounted twice where their kind forbids it.

As kube-scheduler's: a pod using a ReadWriteOncePod claim that a pod already placed (bound or
assumed) uses fits no node ("node has pod using PersistentVolumeClaim with the same name and
ReadWriteOncePod access mode"); on a node, a GCE PD is shared only when every mount is
read-only, an EBS volume never, an iSCSI target (IQN) and an RBD image (a shared monitor, the
same pool and image) only read-only ("node(s) had no available disk").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..framework import OK, SKIP, CycleState, PodChange, Slot, Status, fail
from ..model import Disk, Pod
from ..state import ClusterState, NodeInfo
from ..storage import Storage
from ..volumes import READ_WRITE_ONCE_POD

NAME = "VolumeRestrictions"
DISK_CONFLICT = "node(s) had no available disk"
RWOP_CONFLICT = (
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
)


@dataclass(frozen=True)
class InUse:
    """kube-scheduler's ``preFilterState`` of VolumeRestrictions."""

    claims: frozenset[str]
    """The pod's ReadWriteOncePod claims (names in its namespace)."""
    refs: int
    """How many volumes of placed pods use one of them (the pod fits nowhere while any does)."""


_IN_USE: Slot[InUse] = Slot("VolumeRestrictions/in-use")


def references(other: Pod, pod: Pod, claims: frozenset[str]) -> int:
    """How many of ``other``'s volumes use one of ``pod``'s ReadWriteOncePod ``claims``."""
    if other.uid == pod.uid or other.namespace != pod.namespace:
        return 0
    return sum(1 for v in other.volumes if v.claim in claims and not v.ephemeral)


def disks_conflict(a: Disk, b: Disk) -> bool:
    """isVolumeConflict for one pair of in-tree disks."""
    if a.kind != b.kind or a.id != b.id:
        return False
    if a.kind == "aws-ebs":
        return True
    if a.kind == "rbd" and not set(a.monitors) & set(b.monitors):
        return False
    return not (a.read_only and b.read_only)


def rwop_claims(pod: Pod, storage: Storage) -> set[str]:
    """The pod's ``persistentVolumeClaim`` volumes whose claim asks ReadWriteOncePod; a claim not
    there raises KeyError with kube-scheduler's message."""
    out = set()
    for v in pod.volumes:
        if not v.claim or v.ephemeral:
            continue
        c = storage.claims.get(f"{pod.namespace}/{v.claim}")
        if c is None:
            raise KeyError(f'persistentvolumeclaim "{v.claim}" not found')
        if READ_WRITE_ONCE_POD in c.access_modes:
            out.add(v.claim)
    return out


class VolumeRestrictions:
    NAME = NAME

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        disks = any(v.disk is not None for v in pod.volumes)
        if not pod.claims and not disks:
            return SKIP
        try:
            rwop = frozenset(rwop_claims(pod, self.state.storage))
        except KeyError as e:
            return fail(str(e.args[0]), unresolvable=True)
        refs = self._in_use(pod, rwop) if rwop else 0
        if not disks and not refs:
            return SKIP
        cs.write(_IN_USE, InUse(rwop, refs))
        return OK

    def _in_use(self, pod: Pod, rwop: frozenset[str]) -> int:
        """IsPVCUsedByPods over the placed pods: how many of their volumes use one of
        ``rwop`` (counted per volume, so that taking one of them off counts it off)."""
        return sum(references(other, pod, rwop) for other, _, _ in self.state.pods.values())

    def update_with_pods(self, cs: CycleState, pod: Pod, changes: Sequence[PodChange]) -> None:
        """kube-scheduler's ``AddPod``/``RemovePod``: a pod put on or taken off (a preemption's
        victim) counts for or against the claims in use."""
        held = cs.read(_IN_USE)
        if held is None or not held.claims:
            return
        by = sum(d * references(other, pod, held.claims) for other, _, d in changes)
        if by:
            cs.write(_IN_USE, InUse(held.claims, held.refs + by))

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        mine = [v.disk for v in pod.volumes if v.disk is not None]
        if mine:
            for uid in info.pods:
                other = info.pod(uid, self.state)
                if other is None:
                    continue
                theirs = [v.disk for v in other.volumes if v.disk is not None]
                if any(disks_conflict(a, b) for a in mine for b in theirs):
                    return fail(DISK_CONFLICT)
        held = cs.read(_IN_USE)
        if held is not None and held.refs > 0:
            return fail(RWOP_CONFLICT)
        return OK


def new(state: ClusterState) -> VolumeRestrictions:
    return VolumeRestrictions(state)
