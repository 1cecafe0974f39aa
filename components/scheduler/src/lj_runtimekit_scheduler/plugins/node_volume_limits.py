"""NodeVolumeLimits: a node takes no more CSI volumes of a driver than it can attach.

As kube-scheduler's CSILimits: the limit of each driver is the node's CSINode
``spec.drivers[].allocatable.count`` (or, as before CSINode, its allocatable
``attachable-volumes-csi-<driver>``); the volumes counted are the unique (driver, volume handle)
pairs of the claims of the pods already on the node, plus the new ones of this pod. A claim not
bound yet counts under its class's provisioner with a handle of its own, so that it is counted
once however many pods share it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from ..framework import OK, SKIP, CycleState, Status, fail
from ..model import Node, Pod
from ..state import ClusterState, NodeInfo
from ..storage import Storage

NAME = "NodeVolumeLimits"
EXCEEDED = "node(s) exceed max volume count"
LEGACY_PREFIX = "attachable-volumes-csi-"


class MissingClaim(Exception):
    """A claim of the pod being scheduled is not there: it cannot run without it."""


def csi_volumes(pod: Pod, storage: Storage, prefix: str, new: bool) -> dict[str, str]:
    """filterAttachableVolumes: ``driver/handle`` → driver of the pod's claims that are CSI
    volumes. For the pod being placed (``new``) a missing claim raises :class:`MissingClaim`;
    for a pod already placed it is not counted."""
    out: dict[str, str] = {}
    for v in pod.claims:
        c = storage.claims.get(f"{pod.namespace}/{v.claim}")
        if c is None:
            if new:
                raise MissingClaim(
                    f'looking up PVC {pod.namespace}/{v.claim}: persistentvolumeclaim "{v.claim}" '
                    "not found"
                )
            continue
        if v.ephemeral and c.controller_uid != pod.uid:
            if new:
                raise MissingClaim(
                    f"PVC {c.key} was not created for pod {pod.key} (pod is not owner)"
                )
            continue
        driver, handle = "", ""
        pv = storage.volumes.get(c.volume_name) if c.volume_name else None
        if pv is not None:
            if pv.csi is not None:
                driver, handle = pv.csi
        else:
            # not bound yet (or its PV not seen): counted under the class's provisioner
            cls = storage.classes.get(c.storage_class) if c.storage_class else None
            if cls is not None and cls.provisioner:
                driver, handle = cls.provisioner, f"{prefix}-{c.key}"
        if driver and handle:
            out[f"{driver}/{handle}"] = driver
    return out


def limits(node: Node, storage: Storage) -> dict[str, int]:
    """Driver → how many of its volumes the node can attach."""
    out = {
        k.removeprefix(LEGACY_PREFIX): v
        for k, v in node.allocatable.items()
        if k.startswith(LEGACY_PREFIX)
    }
    csi = storage.csi_nodes.get(node.name)
    if csi is not None:
        out.update(csi.limits)
    return out


def exceeds(new: dict[str, str], attached: dict[str, str], limit: dict[str, int]) -> bool:
    """Whether the node's attached volumes plus the pod's new ones pass a driver's limit (a
    volume already attached for another pod counts once)."""
    fresh = {k: d for k, d in new.items() if k not in attached}
    counts: dict[str, int] = {}
    for d in attached.values():
        counts[d] = counts.get(d, 0) + 1
    adding: dict[str, int] = {}
    for d in fresh.values():
        adding[d] = adding.get(d, 0) + 1
    return any(d in limit and counts.get(d, 0) + n > limit[d] for d, n in adding.items())


class NodeVolumeLimits:
    NAME = NAME

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.storage: Storage = state.storage
        self.prefix = uuid.uuid4().hex
        """Unbound claims' handles, never equal to a real one (upstream: a random prefix)."""

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        return OK if pod.claims else SKIP

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        if not pod.claims:
            return OK
        try:
            new = csi_volumes(pod, self.storage, self.prefix, new=True)
        except MissingClaim as e:
            return fail(str(e), unresolvable=True)
        if not new:
            return OK
        limit = limits(info.node, self.storage)
        if not limit:
            return OK
        attached: dict[str, str] = {}
        for other in self._pods(info):
            attached.update(csi_volumes(other, self.storage, self.prefix, new=False))
        return fail(EXCEEDED) if exceeds(new, attached, limit) else OK

    def _pods(self, info: NodeInfo) -> Iterable[Pod]:
        """The pods on the node with claims (a what-if copy's guests included)."""
        for uid in info.pods:
            other = info.pod(uid, self.state)
            if other is not None and other.claims:
                yield other


def new(state: ClusterState) -> NodeVolumeLimits:
    return NodeVolumeLimits(state)
