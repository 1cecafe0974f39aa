"""Plain data the scheduler decides over: nodes, pods, devices. No I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from .terms import NO_AFFINITY, ControllerRef, PodAffinity, SpreadConstraint

CORE_PER_GPU = 100
ASSIGNMENT_ANNOTATION = "lj-runtimekit-scheduler/gpu-assignment"
ALLOCATED_ANNOTATION = "lj-runtimekit-device-plugin/allocated"
"""The device plugin's mark: the kubelet has allocated this pod's devices (docs/contracts.md)."""
ALLOCATION_ANNOTATION = "lj-runtimekit-device-plugin/allocation"
"""What the device plugin allocated per container, with the actual device ids when it knows them."""
POD_GROUP_ANNOTATION = "lj-runtimekit-scheduler/pod-group"
POD_GROUP_SIZE_ANNOTATION = "lj-runtimekit-scheduler/pod-group-size"

RESOURCE_KINDS = ("gpu", "gpu-core", "gpu-memory", "ppu")
"""Our device resources by kind; their extended resource names come from the config."""


@dataclass(frozen=True)
class ResourceNames:
    """The extended resource name of each kind, as the device plugin's ConfigMap names them
    (renamed there, renamed here: guide §3.6)."""

    gpu: str = "aliyun.com/gpu"
    gpu_core: str = "aliyun.com/gpu-core"
    gpu_memory: str = "aliyun.com/gpu-memory"
    ppu: str = "alibabacloud.com/ppu"

    def of(self, kind: str) -> str:
        """The name of ``kind`` (one of :data:`RESOURCE_KINDS`)."""
        return str(getattr(self, kind.replace("-", "_")))

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(self.of(k) for k in RESOURCE_KINDS)


DEFAULT_NAMES = ResourceNames()

Resources = dict[str, int]
"""Resource name → amount: ``cpu`` in millicores, ``memory`` in bytes, others in units."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, t: Taint) -> bool:
        """As ``v1.Toleration.ToleratesTaint``: empty key with Exists matches every taint."""
        if self.effect and self.effect != t.effect:
            return False
        if self.key and self.key != t.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == t.value


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` or ``matchFields`` entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...]
    field: bool = False


@dataclass(frozen=True)
class Term:
    """A node selector term: all requirements must hold (an empty term matches nothing)."""

    requirements: tuple[Requirement, ...]


@dataclass(frozen=True)
class PreferredTerm:
    weight: int
    term: Term


@dataclass(frozen=True)
class HostPort:
    protocol: str
    ip: str
    port: int


@dataclass(frozen=True)
class DeviceRequest:
    """What one container asks of our device resources."""

    container: str
    gpus: int = 0
    core: int = 0
    memory_gib: int = 0
    ppus: int = 0

    @property
    def shared(self) -> bool:
        return self.core > 0 or self.memory_gib > 0

    @property
    def units(self) -> tuple[tuple[str, int], ...]:
        """(resource kind, units) of each resource asked: what the kubelet's Allocate and
        GetPreferredAllocation tell the device plugin of this container (no pod, no name)."""
        counts = (("gpu", self.gpus), ("gpu-core", self.core), ("gpu-memory", self.memory_gib))
        return tuple((k, n) for k, n in (*counts, ("ppu", self.ppus)) if n)


@dataclass(frozen=True)
class Disk:
    """An in-tree disk a pod mounts, as VolumeRestrictions tells two apart: a GCE PD by name, an
    EBS volume by id, an iSCSI target by IQN, an RBD image by pool and image on a shared
    monitor."""

    kind: str
    """gce-pd, aws-ebs, iscsi or rbd."""
    id: str
    read_only: bool = False
    monitors: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodVolume:
    """One ``spec.volumes[]`` entry as the volume plugins see it."""

    name: str
    claim: str = ""
    """The PersistentVolumeClaim it uses: ``persistentVolumeClaim.claimName``, or for an ephemeral
    volume the claim ``<pod>-<volume>`` the ephemeral-volume controller makes (empty: none)."""
    ephemeral: bool = False
    disk: Disk | None = None


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    scheduler_name: str = "default-scheduler"
    node_name: str = ""
    priority: int = 0
    phase: str = "Pending"
    requests: Resources = field(default_factory=dict)
    """Effective requests: max(sum of app containers, largest init container) + overhead."""
    host_ports: tuple[HostPort, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[Term, ...] | None = None
    """Required node affinity (terms ORed); None when absent."""
    preferred_terms: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    devices: tuple[DeviceRequest, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    scheduling_gates: tuple[str, ...] = ()
    volumes: tuple[PodVolume, ...] = ()
    """Its volumes that use a claim or an in-tree disk (others matter to no plugin)."""
    unsupported: tuple[str, ...] = ()
    """Features of the spec this scheduler does not honour (named in FailedScheduling)."""
    created: str = ""
    deleting: bool = False
    preemption_policy: str = "PreemptLowerPriority"
    """``spec.preemptionPolicy``: ``Never`` waits for room, evicting no lower-priority pod."""
    nominated_node: str = ""
    """``status.nominatedNodeName``: the node a preemption is freeing for the pod."""
    started: str = ""
    """``status.startTime`` (RFC 3339, empty before the kubelet starts it): of two victims of
    one priority, the one started earlier is more important (kube-scheduler's order)."""
    preempted: bool = False
    """Its ``DisruptionTarget`` condition says a scheduler preempts it (PreemptionByScheduler)."""
    affinity: PodAffinity = NO_AFFINITY
    """Inter-pod affinity and anti-affinity (plugins/inter_pod_affinity.py)."""
    spread: tuple[SpreadConstraint, ...] = ()
    """topologySpreadConstraints (plugins/pod_topology_spread.py)."""
    controller: ControllerRef | None = None
    """Its controller, for the default spread constraints (workloads.py)."""
    annotation_writers: tuple[tuple[str, str], ...] = ()
    """(annotation, field manager) for each of the suite's annotations (``lj-runtimekit-*``)
    that ``metadata.managedFields`` says a client set. The Binding subresource writes the pod
    without a field manager, so the scheduler's decision has no writer unless someone edited it."""
    scheduling_group: str = ""
    """``spec.schedulingGroup.podGroupName``: the PodGroup (same namespace) it belongs to."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @cached_property
    def _labels(self) -> Mapping[str, str]:
        return dict(self.labels)

    @cached_property
    def _annotations(self) -> Mapping[str, str]:
        return dict(self.annotations)

    def label(self, k: str) -> str | None:
        return self._labels.get(k)

    def label_map(self) -> Mapping[str, str]:
        """The labels as a mapping, built once per pod object."""
        return self._labels

    def annotation(self, k: str) -> str | None:
        return self._annotations.get(k)

    def writers(self, k: str) -> frozenset[str]:
        """The field managers that set annotation ``k`` (see :attr:`annotation_writers`)."""
        return frozenset(m for key, m in self.annotation_writers if key == k)

    @property
    def claims(self) -> tuple[PodVolume, ...]:
        """Its volumes backed by a PersistentVolumeClaim (persistentVolumeClaim or ephemeral)."""
        return tuple(v for v in self.volumes if v.claim)

    @property
    def wants_devices(self) -> bool:
        return any(d.gpus or d.core or d.memory_gib or d.ppus for d in self.devices)


@dataclass(frozen=True)
class PodGroup:
    """A ``scheduling.k8s.io/v1beta1`` PodGroup, as far as placing its pods goes."""

    namespace: str
    name: str
    min_count: int = 0
    """``spec.schedulingPolicy.gang.minCount``: at least this many of its pods are placed
    together or none is; 0 for the basic policy (its pods are placed one by one)."""
    topology: str | None = None
    """``spec.schedulingConstraints.topology[0].key``: a node label all its pods share."""
    evicted_whole: bool = True
    """Preempted only as a whole: a gang, or ``spec.disruptionMode.all``."""
    scheduled: bool = False
    """Its ``PodGroupInitiallyScheduled`` condition is True (terminal: never written again)."""
    parent: str = ""
    """``spec.parentCompositePodGroupName``: a CompositePodGroup (alpha) it is part of."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gang(self) -> bool:
        return self.min_count > 0


@dataclass(frozen=True)
class Node:
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    allocatable: Resources = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()

    @cached_property
    def _label_map(self) -> Mapping[str, str]:
        return dict(self.labels)

    def label_map(self) -> Mapping[str, str]:
        """The labels as a mapping, built once per node object (objects are replaced, never
        changed, so it cannot go stale)."""
        return self._label_map


@dataclass(frozen=True)
class Device:
    """One accelerator of a node, from its NodeDevices object."""

    id: str
    kind: str = "GPU"
    memory_gib: int = 0
    healthy: bool = True
    numa: int = -1
    island: int = -1
    index: int = 0
    partition_of: str = ""
    """For a MIG instance or TDM slice: the GPU it divides (``id`` is the partition's)."""


@dataclass(frozen=True)
class DeviceUse:
    """What assumed and bound pods hold on one device."""

    whole: bool = False
    core: int = 0
    memory_gib: int = 0
