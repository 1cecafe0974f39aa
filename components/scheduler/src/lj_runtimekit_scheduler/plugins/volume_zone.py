"""VolumeZone: a pod's bound volumes keep it in their zone and region.

As kube-scheduler's (pkg/scheduler/framework/plugins/volumezone): each ``persistentVolumeClaim``
volume of the pod whose claim is bound names a PV; a PV labelled with a zone or region key (the
GA ``topology.kubernetes.io/{zone,region}`` or the beta ``failure-domain.beta.kubernetes.io/…``)
allows the nodes whose label of that key (the GA key standing in for a beta one) is one of the
label's values (``a__b`` lists several). A node with none of these labels fits whatever the
volumes say. An unbound claim of a ``WaitForFirstConsumer`` class is skipped (VolumeBinding
chooses its PV); any other unbound claim, or a claim, class or PV not there, makes the pod
unresolvable at PreFilter, with kube-scheduler's words.

This reads the apiserver's claims and PVs, not the ones VolumeBinding assumed, as kube-scheduler
reads its listers.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..framework import OK, SKIP, CycleState, Slot, Status, fail
from ..model import Pod
from ..state import ClusterState, NodeInfo

NAME = "VolumeZone"
CONFLICT = "node(s) had no available volume zone"
ZONE, REGION = "topology.kubernetes.io/zone", "topology.kubernetes.io/region"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
KEYS = (BETA_ZONE, BETA_REGION, ZONE, REGION)
"""kube-scheduler's topologyLabels, in its order."""
_GA = {BETA_ZONE: ZONE, BETA_REGION: REGION}
_DELIMITER = "__"

Topology = tuple[tuple[str, frozenset[str]], ...]
"""(label key, the values it allows) per zone or region label of the pod's bound PVs."""
_TOPOLOGY: Slot[Topology] = Slot("VolumeZone/topology")


def zones(value: str) -> frozenset[str] | None:
    """LabelZonesToSet: ``a__b`` → {a, b}; None when a part is empty (the label is ignored)."""
    parts = [p.strip() for p in value.split(_DELIMITER)]
    if any(not p for p in parts):
        return None
    return frozenset(parts)


def node_allows(topology: Topology, labels: Mapping[str, str]) -> bool:
    """The Filter's verdict for a node with these labels."""
    if not any(k in labels for k in KEYS):
        return True
    for key, allowed in topology:
        value = labels.get(key)
        if value is None:
            value = labels.get(_GA.get(key, key))
        if value is None or value not in allowed:
            return False
    return True


class VolumeZone:
    NAME = NAME

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def topology(self, pod: Pod) -> Topology | Status:
        """getPVbyPod: the zone and region labels of the pod's bound PVs, or the failure."""
        storage = self.state.storage
        out: list[tuple[str, frozenset[str]]] = []
        for v in pod.volumes:
            if not v.claim or v.ephemeral:
                continue
            claim = storage.claims.get(f"{pod.namespace}/{v.claim}")
            if claim is None:
                return fail(f'persistentvolumeclaim "{v.claim}" not found', unresolvable=True)
            if not claim.volume_name:
                if not claim.storage_class:
                    return fail(
                        "PersistentVolumeClaim had no pv name and storageClass name",
                        unresolvable=True,
                    )
                cls = storage.classes.get(claim.storage_class)
                if cls is None:
                    return fail(
                        f'storageclass.storage.k8s.io "{claim.storage_class}" not found',
                        unresolvable=True,
                    )
                if cls.delayed:
                    continue
                return fail("PersistentVolume had no name", unresolvable=True)
            pv = storage.volumes.get(claim.volume_name)
            if pv is None:
                return fail(f'persistentvolume "{claim.volume_name}" not found', unresolvable=True)
            labels = dict(pv.labels)
            for key in KEYS:
                if key in labels and (allowed := zones(labels[key])) is not None:
                    out.append((key, allowed))
        return tuple(out)

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        if not pod.claims:
            return SKIP
        found = self.topology(pod)
        if isinstance(found, Status):
            return found
        if not found:
            return SKIP
        cs.write(_TOPOLOGY, found)
        return OK

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        topology = cs.read(_TOPOLOGY)
        if topology and not node_allows(topology, info.node.label_map()):
            return fail(CONFLICT, unresolvable=True)
        return OK


def new(state: ClusterState) -> VolumeZone:
    return VolumeZone(state)
