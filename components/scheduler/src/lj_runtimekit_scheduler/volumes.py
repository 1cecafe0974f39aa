"""Storage objects as the volume plugins read them: claims, volumes, classes, CSI nodes, drivers
and capacities, from apiserver JSON (as dicts). Pure; a malformed field raises (the feed skips
the object and names it).

The fields and their defaults are the apiserver's (core/v1 and storage.k8s.io/v1); where the
PV controller and kube-scheduler read a field through a helper (a claim's class from the beta
annotation first, a claim's selector, a PV's node affinity) the helper's rule is kept here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import quantity
from .model import Disk, PodVolume

Json = dict[str, Any]

SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""On a claim: the node kube-scheduler chose, so that its volume is provisioned there."""
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""On a claim: the PV controller finished binding it."""
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
"""On a PV or claim: the binding was made by a controller (or the scheduler), not prebound."""
BETA_CLASS = "volume.beta.kubernetes.io/storage-class"
"""The class annotation that still wins over ``storageClassName`` (GetPersistentVolumeClass)."""
NO_PROVISIONER = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"


@dataclass(frozen=True)
class Selector:
    """A ``metav1.LabelSelector``: every matchLabels pair and every expression must hold."""

    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.labels):
            return False
        for key, op, values in self.expressions:
            value = labels.get(key)
            if op == "In":
                ok = value is not None and value in values
            elif op == "NotIn":
                ok = value is None or value not in values
            elif op == "Exists":
                ok = value is not None
            elif op == "DoesNotExist":
                ok = value is None
            else:  # the apiserver refuses other operators; a selector with one selects nothing
                ok = False
            if not ok:
                return False
        return True


@dataclass(frozen=True)
class NodeTerm:
    """One ``nodeSelectorTerms`` entry of a PV's node affinity: all requirements hold."""

    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]
    fields: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


def _requirement(op: str, values: tuple[str, ...], value: str | None) -> bool:
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_terms_match(terms: tuple[NodeTerm, ...], labels: Mapping[str, str]) -> bool:
    """volume.CheckNodeAffinity: the terms are ORed, each term's requirements ANDed; an empty
    term matches nothing. Upstream knows the node by its labels only, so a ``matchFields``
    requirement sees ``metadata.name`` as empty (kept: the same verdicts)."""
    for t in terms:
        if not t.requirements and not t.fields:
            continue
        if not all(_requirement(op, vs, labels.get(k)) for k, op, vs in t.requirements):
            continue
        fields = {"metadata.name": ""}
        if all(_requirement(op, vs, fields.get(k)) for k, op, vs in t.fields):
            return True
    return False


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Claim:
    """A PersistentVolumeClaim."""

    namespace: str
    name: str
    uid: str
    version: str = ""
    storage_class: str = ""
    access_modes: tuple[str, ...] = ()
    request: int | None = None
    """Bytes of ``resources.requests.storage`` (None: not asked)."""
    volume_mode: str = "Filesystem"
    selector: Selector | None = None
    volume_name: str = ""
    selected_node: str | None = None
    bind_completed: bool = False
    phase: str = "Pending"
    deleting: bool = False
    controller_uid: str = ""
    """uid of its controlling owner (an ephemeral volume's claim: the pod)."""
    attributes_class: str = ""
    raw: Json = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def fully_bound(self) -> bool:
        """isPVCFullyBound: a volume named and the PV controller's bind-completed mark."""
        return bool(self.volume_name) and self.bind_completed


@dataclass(frozen=True)
class Volume:
    """A PersistentVolume."""

    name: str
    uid: str = ""
    version: str = ""
    capacity: int = 0
    access_modes: tuple[str, ...] = ()
    storage_class: str = ""
    volume_mode: str = "Filesystem"
    claim_ref: ClaimRef | None = None
    phase: str = "Available"
    deleting: bool = False
    node_affinity: tuple[NodeTerm, ...] | None = None
    """Required node affinity terms (None: none, the volume is reachable from every node)."""
    labels: tuple[tuple[str, str], ...] = ()
    csi: tuple[str, str] | None = None
    """(driver, volumeHandle) of a CSI volume."""
    attributes_class: str = ""
    raw: Json = field(default_factory=dict, compare=False, hash=False, repr=False)

    def reachable_from(self, labels: Mapping[str, str]) -> bool:
        return self.node_affinity is None or node_terms_match(self.node_affinity, labels)

    def bound_to(self, claim: Claim) -> bool:
        """IsVolumeBoundToClaim: claimRef names the claim (and its uid, when it has one)."""
        ref = self.claim_ref
        if ref is None or (ref.namespace, ref.name) != (claim.namespace, claim.name):
            return False
        return not ref.uid or ref.uid == claim.uid


@dataclass(frozen=True)
class StorageClass:
    name: str
    provisioner: str = ""
    binding_mode: str = "Immediate"
    allowed_topologies: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = ()
    """Terms (ORed) of (label key, values) requirements (ANDed); none: every node."""

    @property
    def delayed(self) -> bool:
        return self.binding_mode == WAIT_FOR_FIRST_CONSUMER

    def allows(self, labels: Mapping[str, str]) -> bool:
        """MatchTopologySelectorTerms: no terms allow every node."""
        if not self.allowed_topologies:
            return True
        return any(all(labels.get(k) in vs for k, vs in term) for term in self.allowed_topologies)


@dataclass(frozen=True)
class CsiNode:
    node: str
    limits: tuple[tuple[str, int], ...] = ()
    """(driver, allocatable.count) of each driver that reports one."""


@dataclass(frozen=True)
class CsiDriver:
    name: str
    storage_capacity: bool = False


@dataclass(frozen=True)
class Capacity:
    """A CSIStorageCapacity."""

    key: str
    storage_class: str
    limit: int | None
    """maximumVolumeSize when given (the more precise), else capacity; None: neither."""
    topology: Selector | None = None


def _selector(raw: Json | None) -> Selector | None:
    if raw is None:
        return None
    exprs = tuple(
        (str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
        for e in raw.get("matchExpressions") or ()
    )
    labels = tuple(sorted((str(k), str(v)) for k, v in (raw.get("matchLabels") or {}).items()))
    return Selector(labels, exprs)


def _triples(raw: list[Json] | None) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    return tuple(
        (str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
        for e in raw or ()
    )


def _bytes(q: object) -> int:
    if not isinstance(q, str | int | float):
        raise ValueError(f"not a storage quantity: {q!r}")
    return quantity.parse(q)


def _meta(raw: Json) -> Json:
    meta = raw["metadata"]
    if not isinstance(meta, dict):
        raise TypeError("metadata is not an object")
    return meta


def claim(raw: Json) -> Claim:
    meta, spec, status = _meta(raw), raw.get("spec") or {}, raw.get("status") or {}
    ann = meta.get("annotations") or {}
    requests = (spec.get("resources") or {}).get("requests") or {}
    owner = next(
        (str(o.get("uid", "")) for o in meta.get("ownerReferences") or () if o.get("controller")),
        "",
    )
    storage_class = ann[BETA_CLASS] if BETA_CLASS in ann else spec.get("storageClassName") or ""
    return Claim(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        version=str(meta.get("resourceVersion", "")),
        storage_class=str(storage_class),
        access_modes=tuple(str(m) for m in spec.get("accessModes") or ()),
        request=_bytes(requests["storage"]) if "storage" in requests else None,
        volume_mode=str(spec.get("volumeMode") or "Filesystem"),
        selector=_selector(spec.get("selector")),
        volume_name=str(spec.get("volumeName") or ""),
        selected_node=str(ann[SELECTED_NODE]) if SELECTED_NODE in ann else None,
        bind_completed=BIND_COMPLETED in ann,
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        controller_uid=owner,
        attributes_class=str(spec.get("volumeAttributesClassName") or ""),
        raw=raw,
    )


def volume(raw: Json) -> Volume:
    meta, spec, status = _meta(raw), raw.get("spec") or {}, raw.get("status") or {}
    ann = meta.get("annotations") or {}
    ref = spec.get("claimRef")
    claim_ref = None
    if ref:
        ns, name, uid = ref.get("namespace", ""), ref.get("name", ""), ref.get("uid", "")
        claim_ref = ClaimRef(str(ns), str(name), str(uid))
    required = (spec.get("nodeAffinity") or {}).get("required")
    terms = None
    if required is not None:
        terms = tuple(
            NodeTerm(_triples(t.get("matchExpressions")), _triples(t.get("matchFields")))
            for t in required.get("nodeSelectorTerms") or ()
        )
    csi = spec.get("csi")
    storage_class = ann[BETA_CLASS] if BETA_CLASS in ann else spec.get("storageClassName") or ""
    cap = (spec.get("capacity") or {}).get("storage")
    return Volume(
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        version=str(meta.get("resourceVersion", "")),
        capacity=_bytes(cap) if cap is not None else 0,
        access_modes=tuple(str(m) for m in spec.get("accessModes") or ()),
        storage_class=str(storage_class),
        volume_mode=str(spec.get("volumeMode") or "Filesystem"),
        claim_ref=claim_ref,
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        node_affinity=terms,
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        csi=(str(csi["driver"]), str(csi["volumeHandle"])) if csi else None,
        attributes_class=str(spec.get("volumeAttributesClassName") or ""),
        raw=raw,
    )


def storage_class(raw: Json) -> StorageClass:
    meta = _meta(raw)
    terms = tuple(
        tuple(
            (str(e["key"]), tuple(str(v) for v in e.get("values") or ()))
            for e in t.get("matchLabelExpressions") or ()
        )
        for t in raw.get("allowedTopologies") or ()
    )
    return StorageClass(
        name=str(meta["name"]),
        provisioner=str(raw.get("provisioner") or ""),
        # the apiserver defaults an absent mode to Immediate
        binding_mode=str(raw.get("volumeBindingMode") or "Immediate"),
        allowed_topologies=terms,
    )


def csi_node(raw: Json) -> CsiNode:
    meta, spec = _meta(raw), raw.get("spec") or {}
    limits = []
    for d in spec.get("drivers") or ():
        count = (d.get("allocatable") or {}).get("count")
        if count is not None:
            limits.append((str(d["name"]), int(count)))
    return CsiNode(str(meta["name"]), tuple(limits))


def csi_driver(raw: Json) -> CsiDriver:
    spec = raw.get("spec") or {}
    return CsiDriver(str(_meta(raw)["name"]), spec.get("storageCapacity") is True)


def capacity(raw: Json) -> Capacity:
    meta = _meta(raw)
    size = raw.get("maximumVolumeSize")
    if size is None:
        size = raw.get("capacity")
    return Capacity(
        key=f"{meta.get('namespace', '')}/{meta['name']}",
        storage_class=str(raw.get("storageClassName") or ""),
        limit=None if size is None else _bytes(size),
        topology=_selector(raw.get("nodeTopology")),
    )


def _disk(v: Json) -> Disk | None:
    if (gce := v.get("gcePersistentDisk")) is not None:
        return Disk("gce-pd", str(gce.get("pdName", "")), bool(gce.get("readOnly")))
    if (ebs := v.get("awsElasticBlockStore")) is not None:
        return Disk("aws-ebs", str(ebs.get("volumeID", "")), bool(ebs.get("readOnly")))
    if (iscsi := v.get("iscsi")) is not None:
        return Disk("iscsi", str(iscsi.get("iqn", "")), bool(iscsi.get("readOnly")))
    if (rbd := v.get("rbd")) is not None:
        image = f"{rbd.get('pool') or 'rbd'}/{rbd.get('image', '')}"
        monitors = tuple(str(m) for m in rbd.get("monitors") or ())
        return Disk("rbd", image, bool(rbd.get("readOnly")), monitors)
    return None


def pod_volumes(pod_name: str, spec: Json) -> tuple[PodVolume, ...]:
    """The pod's volumes that a volume plugin reads: claims (an ephemeral volume's claim is
    ``<pod>-<volume>``, ephemeral.VolumeClaimName) and in-tree disks."""
    out = []
    for v in spec.get("volumes") or ():
        name = str(v["name"])
        if (pvc := v.get("persistentVolumeClaim")) is not None:
            out.append(PodVolume(name, claim=str(pvc["claimName"])))
        elif v.get("ephemeral") is not None:
            out.append(PodVolume(name, claim=f"{pod_name}-{name}", ephemeral=True))
        elif (disk := _disk(v)) is not None:
            out.append(PodVolume(name, disk=disk))
    return tuple(out)
