"""The scheduler's view of the cluster: nodes, devices, bound and assumed pods. No I/O.

Fed by the apiserver watches (``kube.py``) and by the scheduler's own assumptions: a pod is
assumed on a node as soon as it is reserved, so the next cycle sees its resources held even
before the binding comes back through the watch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from . import assignment, dra
from .budgets import Budget
from .gang import GangId, gang_of
from .gpu import Choice, apply
from .model import (
    ASSIGNMENT_ANNOTATION,
    DEFAULT_NAMES,
    Device,
    DeviceUse,
    HostPort,
    Node,
    Pod,
    PodGroup,
    ResourceNames,
    Resources,
)
from .placed import PlacedPods
from .storage import Storage
from .workloads import Workloads


@dataclass(frozen=True)
class Pending:
    """A pod on a node whose devices the device plugin has not confirmed yet (docs/contracts.md):
    the kubelet's next Allocate of one of these ``units`` may be its."""

    pod: str
    """namespace/name, for the reason shown to the pods it blocks."""
    gang: GangId | None
    units: frozenset[tuple[str, int]]
    """(resource kind, unit count) of every container's every device resource."""


@dataclass(frozen=True)
class Edited:
    """A bound pod whose ``gpu-assignment`` no longer says what the scheduler decided."""

    kept: Choice | None
    """What the scheduler goes on counting."""
    annotated: Choice | None
    """What the annotation says now (None: removed, or nothing the scheduler would write)."""
    source: str = "what it decided"
    """Where :attr:`kept` comes from."""
    by: frozenset[str] = frozenset()
    """The field managers that set the annotation (``metadata.managedFields``)."""

    def message(self) -> str:
        now = assignment.describe(self.annotated) if self.annotated else "no usable decision"
        who = f" by {', '.join(sorted(self.by))}" if self.by else ""
        kept = assignment.describe(self.kept) if self.kept else "no devices"
        return (
            f"{ASSIGNMENT_ANNOTATION} was changed{who} after the pod was bound (now: {now}); "
            f"the scheduler keeps counting {self.source} ({kept}) and gives none of it to "
            "other pods. The annotation is the scheduler's, not to be edited"
        )


@dataclass(frozen=True)
class Nomination:
    """A pod a preemption is freeing room for on ``node`` (its ``status.nominatedNodeName``):
    pods of its priority or lower do not take that room meanwhile (kube-scheduler's nominator)."""

    pod: Pod
    node: str
    choice: Choice | None
    """The devices it gets there once its victims are gone (None: not known, e.g. read back
    from the pod's status after a restart; its requests are still held)."""


REBUILT = "the sizes the pod requests, on the devices the device plugin reports it allocated"
"""Where a pod's devices come from when its decision is not believed at first sight."""
REBUILT_UNREPORTED = (
    "the sizes the pod requests, on the devices the annotation names (what the device plugin "
    "allocates at admission; it reports no allocation for this pod)"
)


def pending(pod: Pod, choice: Choice | None) -> Pending | None:
    """``pod`` as a pending allocation, or None: it has a decision, no mark of the device plugin
    yet, is not being deleted and has not ended. A Running pod without the mark still counts:
    the device plugin counts it among its candidates too (it cannot tell a pod whose mark failed
    to be written from one not yet admitted), and the two sides must agree."""
    ended = pod.phase in ("Succeeded", "Failed")
    if choice is None or pod.deleting or ended or assignment.confirmed(pod):
        return None
    units = frozenset(u for d in pod.devices for u in d.units)
    return Pending(pod.key, gang_of(pod), units) if units else None


@dataclass
class NodeInfo:
    """One node with what its pods hold; plugins read it, only :class:`ClusterState` writes."""

    node: Node
    devices: tuple[Device, ...] = ()
    requested: Resources = field(default_factory=dict)
    ports: set[HostPort] = field(default_factory=set)
    device_use: dict[str, DeviceUse] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)
    confirms: bool = False
    """A device plugin keeps this node's NodeDevices and marks the pods it allocated."""
    pending: dict[str, Pending] = field(default_factory=dict)
    """uid → the pods on this node whose allocation is not confirmed yet."""
    version: int = 0
    """Bumped whenever what the node holds or its devices change (plugins key caches on it)."""
    guests: dict[str, Pod] = field(default_factory=dict)
    """uid → the pods of :attr:`pods` that only a what-if copy holds (``whatif.py``: pods
    nominated there, or placed by a dry run), which :attr:`ClusterState.pods` does not."""

    def pod(self, uid: str, state: ClusterState) -> Pod | None:
        """The pod ``uid`` of :attr:`pods`, a guest of a what-if copy included."""
        held = state.pods.get(uid)
        return held[0] if held is not None else self.guests.get(uid)


class ClusterState:
    """Nodes and the pods on them, with assumed pods counted until their binding is seen."""

    def __init__(
        self, names: ResourceNames = DEFAULT_NAMES, driver: str = dra.DEFAULT_DRIVER
    ) -> None:
        self.names = names
        self.dra = dra.Ledger(driver)
        """Our driver's ResourceSlices and allocated claims (nodes in DRA mode)."""
        self.nodes: dict[str, NodeInfo] = {}
        self.ghosts: dict[str, NodeInfo] = {}
        """Node names pods are bound to that the apiserver has no Node for (yet, or any more):
        what those pods hold, kept apart from :attr:`nodes` so that no plugin places onto them
        and no refusal counts them (kube-scheduler's NodeInfo without a Node). A ghost becomes a
        node when its Node arrives, and goes when its last pod does."""
        self.devices: dict[str, tuple[Device, ...]] = {}
        self.confirming: set[str] = set()
        """Nodes whose NodeDevices a device plugin keeps (it confirms allocations)."""
        self.pods: dict[str, tuple[Pod, str, Choice | None]] = {}
        """uid → (pod, node, device choice) of every pod holding resources."""
        self.assumed: dict[str, float] = {}
        """uid → deadline of an assumption not yet confirmed by the watch."""
        self.gangs: dict[GangId, dict[str, str]] = {}
        """gang → {uid: node} of its members in :attr:`pods` (a gang's cycle reads its own
        members here rather than walking every pod held in the cluster)."""
        self.written: dict[str, Choice] = {}
        """uid → the decision this scheduler wrote in the pod's Binding (or, for a pod bound
        before it started, the one it first saw): what the pod holds, whatever its owner
        edits on the annotation afterwards (issue 34)."""
        self.edit_seen: dict[str, str] = {}
        """uid → the edited annotation value already reported (one Event per edit)."""
        self.generation = 0
        """Bumped on every change; the queue requeues unschedulable pods when it moves."""
        self.nominated: dict[str, Nomination] = {}
        """uid → the nomination of a pending pod (preemption, ``plugins/default_preemption.py``)."""
        self.nominated_on: dict[str, dict[str, Nomination]] = {}
        """node → uid → the nominations on it."""
        self.evicting: set[str] = set()
        """Victims whose preemption this scheduler asked for, until they leave the state."""
        self.budgets: dict[str, Budget] = {}
        """PodDisruptionBudgets by uid."""
        self.placed = PlacedPods()
        """The pods of :attr:`pods` indexed for the cross-node plugins (InterPodAffinity,
        PodTopologySpread)."""
        self.node_epoch = 0
        """Bumped when a node comes, goes, or changes its labels or taints (what decides which
        topology domains a pod may spread over), not on a status update."""
        self.namespace_labels: dict[str, Mapping[str, str]] = {}
        """namespace → its labels (inter-pod terms' namespaceSelector)."""
        self.workloads = Workloads()
        """Selectors of Services and pod controllers (default spread constraints)."""
        self.storage = Storage()
        """Claims, PVs and the storage objects the volume plugins read (``storage.py``)."""
        self.pod_groups: dict[str, PodGroup] = {}
        """``scheduling.k8s.io/v1beta1`` PodGroups by ``namespace/name``."""

    def group_of(self, gid: GangId | None) -> PodGroup | None:
        """The PodGroup of a PodGroup gang (None: an annotation gang, or not seen yet)."""
        return self.pod_groups.get(gid.group) if gid is not None and gid.group else None

    def evicted_whole(self, gid: GangId) -> bool:
        """Whether the gang's members are preempted only all together: every annotation gang,
        and a PodGroup unless it has the basic policy with ``disruptionMode: single`` (one
        not seen yet counts as a gang)."""
        group = self.group_of(gid)
        return group is None or group.evicted_whole

    # -- nodes and devices
    def set_node(self, node: Node) -> None:
        info = self.nodes.get(node.name)
        if info is None and (info := self.ghosts.pop(node.name, None)) is not None:
            self.nodes[node.name] = info  # its pods were seen first: they hold what they held
            self.node_epoch += 1
        elif info is None:
            info = self.nodes[node.name] = self._new_info(node)
            self.node_epoch += 1
        elif info.node.labels != node.labels or info.node.taints != node.taints:
            self.node_epoch += 1
        info.node = node
        info.version += 1
        self.generation += 1

    def remove_node(self, name: str) -> None:
        info = self.nodes.pop(name, None)
        if info is not None and info.pods:
            # its pods are not gone with it (a Node deleted and registered again by its kubelet
            # keeps running them): what they hold waits for them or for the Node's return
            self.ghosts[name] = info
        self.node_epoch += 1
        self.generation += 1

    def _new_info(self, node: Node) -> NodeInfo:
        name = node.name
        return NodeInfo(node, self.devices.get(name, ()), confirms=name in self.confirming)

    def set_devices(self, node: str, devices: tuple[Device, ...], confirms: bool = False) -> None:
        self.devices[node] = devices
        (self.confirming.add if confirms else self.confirming.discard)(node)
        if (info := self.nodes.get(node) or self.ghosts.get(node)) is not None:
            info.devices = devices
            info.confirms = confirms
            info.version += 1
        self.generation += 1

    def is_pending(self, uid: str) -> bool:
        """Whether ``uid`` holds devices the device plugin has not confirmed yet (never on a
        node in DRA mode: the kubelet prepares its claim, nothing is confirmed)."""
        held = self.pods.get(uid)
        if held is None or held[1] not in self.nodes or self.dra.serves(held[1]):
            return False
        return uid in self.nodes[held[1]].pending

    # -- DRA
    def set_slice(self, name: str, raw: dict[str, object] | None) -> None:
        self._dra_changed(self.dra.set_slice(name, raw))

    def set_claim(self, raw: dict[str, object] | None, uid: str = "") -> None:
        self._dra_changed(self.dra.set_claim(raw, uid))

    def _dra_changed(self, nodes: set[str]) -> None:
        for n in nodes:
            if n in self.nodes:
                self.nodes[n].version += 1
        if nodes:
            self.generation += 1

    def device_use(self, info: NodeInfo) -> dict[str, DeviceUse]:
        """What is held of each device of ``info``'s node: our pods' decisions, and on a node in
        DRA mode also the claims others allocated there."""
        if not self.dra.serves(info.node.name):
            return info.device_use

        def counted(uid: str) -> bool:
            held = self.pods.get(uid)
            return held is not None and held[2] is not None

        return dra.merge(info.device_use, self.dra.use(info.node.name, counted))

    # -- preemption
    def nominate(self, pod: Pod, node: str, choice: Choice | None) -> None:
        """Hold room on ``node`` for ``pod`` (replacing any nomination it had)."""
        self.unnominate(pod.uid)
        n = self.nominated[pod.uid] = Nomination(pod, node, choice)
        self.nominated_on.setdefault(node, {})[pod.uid] = n
        self._touch(node)

    def unnominate(self, uid: str) -> Nomination | None:
        """End ``uid``'s nomination; returns it (None: it had none)."""
        n = self.nominated.pop(uid, None)
        if n is None:
            return None
        on = self.nominated_on.get(n.node, {})
        on.pop(uid, None)
        if not on:
            self.nominated_on.pop(n.node, None)
        self._touch(n.node)
        return n

    def _touch(self, node: str) -> None:
        if node in self.nodes:
            self.nodes[node].version += 1
        self.generation += 1

    def terminating_by_preemption(self, pod: Pod) -> bool:
        """Being deleted because a scheduler preempted it (or this one asked to)."""
        return pod.uid in self.evicting or (pod.deleting and pod.preempted)

    # -- pods
    def _hold(self, info: NodeInfo, pod: Pod, choice: Choice | None, sign: int) -> None:
        info.version += 1
        for k, v in pod.requests.items():
            info.requested[k] = info.requested.get(k, 0) + sign * v
        if sign > 0:
            info.ports.update(pod.host_ports)
            info.pods.add(pod.uid)
            if (p := pending(pod, choice)) is not None:
                info.pending[pod.uid] = p
        else:
            info.ports.difference_update(pod.host_ports)
            info.pods.discard(pod.uid)
            info.pending.pop(pod.uid, None)
        if choice is None:
            return
        if sign > 0:
            info.device_use = apply(info.device_use, choice)
            return
        # Given back: recount from the pods still there rather than subtract. Two pods may name
        # one whole GPU (a decision a user forged on their own pod); subtracting would free the
        # GPU its real holder still has.
        uses: dict[str, DeviceUse] = {}
        for uid in info.pods:
            held = self.pods.get(uid)
            if held is not None and held[2] is not None:
                uses = apply(uses, held[2])
        info.device_use = uses

    def add_pod(self, pod: Pod, node: str, choice: Choice | None = None) -> None:
        """Count ``pod`` on ``node`` (replacing what it held before)."""
        self.remove_pod(pod.uid, keep_assumed=True)
        info = self.nodes.get(node) or self.ghosts.get(node)
        if info is None:
            # a pod seen before its node (the watches run independently) or after it was
            # deleted: a ghost, which already has the node's devices if those came first
            info = self.ghosts[node] = self._new_info(Node(node, ready=False))
        self._hold(info, pod, choice, +1)
        self.pods[pod.uid] = (pod, node, choice)
        self.placed.add(pod, node)
        if (gid := gang_of(pod)) is not None:
            self.gangs.setdefault(gid, {})[pod.uid] = node
        self.generation += 1

    def remove_pod(self, uid: str, keep_assumed: bool = False) -> None:
        held = self.pods.pop(uid, None)
        self.placed.remove(uid)
        if not keep_assumed:
            self.assumed.pop(uid, None)
            self.written.pop(uid, None)
            self.edit_seen.pop(uid, None)
            self.evicting.discard(uid)
        if held is None:
            return
        pod, node, choice = held
        if (info := self.nodes.get(node) or self.ghosts.get(node)) is not None:
            self._hold(info, pod, choice, -1)
            if not info.pods and self.ghosts.get(node) is info:
                del self.ghosts[node]
        if (gid := gang_of(pod)) is not None and (members := self.gangs.get(gid)) is not None:
            members.pop(uid, None)
            if not members:
                del self.gangs[gid]
        self.generation += 1

    def observe_pod(self, pod: Pod) -> Edited | None:
        """A pod from the watch: bound and running pods hold resources, finished ones not.

        Guarantees: a bound pod's devices are the decision the scheduler wrote (or first saw),
        corrected only by what the device plugin reports it allocated; an edit of the
        ``gpu-assignment`` annotation afterwards changes nothing counted and is returned, once
        per edited value, for the feed to report."""
        if not pod.node_name or pod.phase in ("Succeeded", "Failed"):
            if pod.uid not in self.assumed:
                self.remove_pod(pod.uid)
            return None
        edited = None
        # A pod asking for none of our devices holds none, whatever its annotations say.
        annotated = assignment.decision(pod) if pod.devices else None
        choice = self.written.get(pod.uid) if pod.devices else None
        if choice is None:
            if pod.devices:
                choice, edited = self._first_sight(pod, annotated)
        elif assignment.same(annotated, choice):
            self.edit_seen.pop(pod.uid, None)
        else:
            raw = pod.annotation(ASSIGNMENT_ANNOTATION) or ""
            if self.edit_seen.get(pod.uid) != raw:
                self.edit_seen[pod.uid] = raw
                edited = Edited(choice, annotated)
        # the devices the device plugin reports, where they differ, are what the pod holds
        choice = assignment.held(pod, choice, self.names)
        self.assumed.pop(pod.uid, None)
        self.add_pod(pod, pod.node_name, choice)
        return edited

    def _first_sight(
        self, pod: Pod, annotated: Choice | None
    ) -> tuple[Choice | None, Edited | None]:
        """A bound pod this scheduler did not bind (it restarted, it was just elected, another
        scheduler bound it): its decision is believed only as the Binding left it
        (:func:`assignment.believed`); else it holds what :func:`assignment.rebuilt` says, and an
        annotation someone set is reported once per value. Only a believed decision becomes
        :attr:`written`; the rest is worked out again at every sight, so a report of the device
        plugin that comes later is followed."""
        if annotated is not None and assignment.believed(pod, annotated):
            self.written[pod.uid] = annotated
            return annotated, None
        choice = assignment.rebuilt(pod, annotated, self.names)
        raw = pod.annotation(ASSIGNMENT_ANNOTATION)
        if raw is None or self.edit_seen.get(pod.uid) == raw:
            return choice, None  # none to report (a pod bound some other way), or reported
        self.edit_seen[pod.uid] = raw
        source = REBUILT if assignment.reported(pod, self.names) else REBUILT_UNREPORTED
        return choice, Edited(choice, annotated, source, pod.writers(ASSIGNMENT_ANNOTATION))

    def assume(self, pod: Pod, node: str, choice: Choice | None, deadline: float) -> None:
        self.add_pod(pod, node, choice)
        self.assumed[pod.uid] = deadline
        if choice is not None:
            self.written[pod.uid] = choice  # what the Binding writes (gpu_fit.pre_bind)

    def forget(self, uid: str) -> None:
        if uid in self.assumed:
            self.remove_pod(uid)

    def expire(self, now: float) -> list[str]:
        """Drop assumptions whose binding never showed up; returns their uids."""
        gone = [uid for uid, t in self.assumed.items() if t <= now]
        for uid in gone:
            self.remove_pod(uid)
        return gone
