"""VolumeRestrictions: a ReadWriteOncePod claim is used by one pod, and in-tree disks are not
mounted twice where their kind forbids it.

As kube-scheduler's: a pod using a ReadWriteOncePod claim that a pod already placed (bound or
assumed) uses fits no node ("node has pod using PersistentVolumeClaim with the same name and
ReadWriteOncePod access mode"); on a node, a GCE PD is shared only when every mount is
read-only, an EBS volume never, an iSCSI target (IQN) and an RBD image (a shared monitor, the
same pool and image) only read-only ("node(s) had no available disk").
"""

from __future__ import annotations

from ..framework import OK, SKIP, CycleState, Slot, Status, fail
from ..model import Disk, Pod
from ..state import ClusterState, NodeInfo
from ..storage import Storage
from ..volumes import READ_WRITE_ONCE_POD

NAME = "VolumeRestrictions"
DISK_CONFLICT = "node(s) had no available disk"
RWOP_CONFLICT = (
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
)
_IN_USE: Slot[int] = Slot("VolumeRestrictions/in-use")
"""How many of the pod's ReadWriteOncePod claims placed pods already use."""


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
            rwop = rwop_claims(pod, self.state.storage)
        except KeyError as e:
            return fail(str(e.args[0]), unresolvable=True)
        in_use = self._in_use(pod, rwop) if rwop else 0
        if not disks and not in_use:
            return SKIP
        cs.write(_IN_USE, in_use)
        return OK

    def _in_use(self, pod: Pod, rwop: set[str]) -> int:
        """IsPVCUsedByPods over the placed pods: how many of ``rwop`` one of them uses."""
        used: set[str] = set()
        for other, _, _ in self.state.pods.values():
            if other.namespace != pod.namespace or other.uid == pod.uid:
                continue
            for v in other.volumes:
                if v.claim in rwop and not v.ephemeral:
                    used.add(v.claim)
        return len(used)

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        mine = [v.disk for v in pod.volumes if v.disk is not None]
        if mine:
            for uid in info.pods:
                held = self.state.pods.get(uid)
                if held is None:
                    continue
                theirs = [v.disk for v in held[0].volumes if v.disk is not None]
                if any(disks_conflict(a, b) for a in mine for b in theirs):
                    return fail(DISK_CONFLICT)
        if cs.read(_IN_USE):
            return fail(RWOP_CONFLICT)
        return OK


def new(state: ClusterState) -> VolumeRestrictions:
    return VolumeRestrictions(state)
