"""Apiserver JSON (as dicts) → the scheduler's plain data. Pure; malformed fields are errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import quantity, terms, volumes
from .model import (
    DEFAULT_NAMES,
    RESOURCE_KINDS,
    Device,
    DeviceRequest,
    HostPort,
    Node,
    Pod,
    PodGroup,
    PreferredTerm,
    Requirement,
    ResourceNames,
    Resources,
    Taint,
    Term,
    Toleration,
)

Json = dict[str, Any]
PREEMPTED_REASON = "PreemptionByScheduler"
"""The reason of the ``DisruptionTarget`` condition a scheduler sets on the pods it preempts."""


def resources(raw: Json | None) -> Resources:
    """A requests/allocatable map in the scheduler's units (cpu in millicores)."""
    out: Resources = {}
    for name, q in (raw or {}).items():
        out[name] = quantity.parse(q, milli=(name == "cpu"))
    return out


def _add(into: Resources, r: Resources) -> None:
    for k, v in r.items():
        into[k] = into.get(k, 0) + v


POD_LEVEL = ("cpu", "memory")
"""Resources pod-level ``spec.resources`` may set (and ``hugepages-*``)."""


def effective_requests(spec: Json) -> Resources:
    """As kube-scheduler: max(sum of app containers and sidecars, each regular init container
    with the sidecars started before it); pod-level ``spec.resources`` requests replace that
    for cpu, memory and hugepages; then ``spec.overhead``."""
    total: Resources = {}
    for c in spec.get("containers") or ():
        _add(total, resources((c.get("resources") or {}).get("requests")))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in spec.get("initContainers") or ():
        req = resources((c.get("resources") or {}).get("requests"))
        if c.get("restartPolicy") == "Always":
            _add(total, req)
            _add(sidecars, req)
            continue
        # a regular init container runs next to the sidecars started before it, not beside
        # the later ones: compared with the total only once every sidecar is in it
        _add(req, sidecars)
        for k, v in req.items():
            init_peak[k] = max(init_peak.get(k, 0), v)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    pod_level = resources((spec.get("resources") or {}).get("requests"))
    for k, v in pod_level.items():
        if k in POD_LEVEL or k.startswith("hugepages-"):
            total[k] = v
    _add(total, resources(spec.get("overhead")))
    total["pods"] = 1
    return total


def _requirements(exprs: list[Json] | None, is_field: bool) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(e["key"], e["operator"], tuple(e.get("values") or ()), is_field)
        for e in exprs or ()
    )


def _term(raw: Json) -> Term:
    return Term(
        _requirements(raw.get("matchExpressions"), False)
        + _requirements(raw.get("matchFields"), True)
    )


def _unsupported(spec: Json) -> tuple[str, ...]:
    found = []
    if spec.get("resourceClaims"):
        found.append("dynamic resource allocation (spec.resourceClaims)")
    group = spec.get("schedulingGroup")
    if group and not _group_name(group):
        # a group of a kind newer than podGroupName: placing its pods one by one could break
        # what it promises, so they wait (named in FailedScheduling)
        found.append("a scheduling group other than a PodGroup (spec.schedulingGroup)")
    return tuple(found)


def _group_name(group: object) -> str:
    name = group.get("podGroupName") if isinstance(group, dict) else None
    return name if isinstance(name, str) else ""


def _devices(spec: Json, names: ResourceNames) -> tuple[DeviceRequest, ...]:
    out = []
    for c in spec.get("containers") or ():
        res = c.get("resources") or {}
        raw = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        if not any(r in raw for r in names.all):
            continue
        n = {
            k: quantity.parse(raw[names.of(k)]) if names.of(k) in raw else 0 for k in RESOURCE_KINDS
        }
        out.append(DeviceRequest(c["name"], n["gpu"], n["gpu-core"], n["gpu-memory"], n["ppu"]))
    return tuple(out)


OUR_ANNOTATIONS = "lj-runtimekit-"
"""The prefix of the suite's annotation keys, whose writers :func:`annotation_writers` reads."""


def annotation_writers(meta: Json) -> tuple[tuple[str, str], ...]:
    """(annotation, manager) of every ``managedFields`` entry that owns one of the suite's
    annotations. An entry recorded for the ``binding`` subresource is the Binding's, not an edit
    (today's apiservers record none: the Binding writes the pod without a field manager).
    Entries of another shape are passed over (the apiserver checks managedFields)."""
    out: set[tuple[str, str]] = set()
    for entry in meta.get("managedFields") or ():
        if not isinstance(entry, dict) or entry.get("subresource") == "binding":
            continue
        fields = entry.get("fieldsV1")
        annotations = (fields.get("f:metadata") or {}) if isinstance(fields, dict) else {}
        annotations = annotations.get("f:annotations") if isinstance(annotations, dict) else None
        if not isinstance(annotations, dict):
            continue
        manager = str(entry.get("manager") or "")
        out.update(
            (k[2:], manager)
            for k in annotations
            if isinstance(k, str) and k.startswith("f:" + OUR_ANNOTATIONS)
        )
    return tuple(sorted(out))


def pod(raw: Json, names: ResourceNames = DEFAULT_NAMES) -> Pod:
    """The pod as the scheduler sees it, our device resources read under ``names``; raises
    ValueError/KeyError on a malformed object."""
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    requests = effective_requests(spec)
    devices = _devices(spec, names)
    # a sidecar (restartable init container) holds its ports for the pod's whole life
    sidecars = [c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"]
    ports = tuple(
        HostPort(p.get("protocol", "TCP"), p.get("hostIP", "0.0.0.0"), int(p["hostPort"]))
        for c in (*sidecars, *(spec.get("containers") or ()))
        for p in c.get("ports") or ()
        if p.get("hostPort")
    )
    node_aff = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    req = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    required = None if req is None else tuple(_term(t) for t in req.get("nodeSelectorTerms") or ())
    preferred = tuple(
        PreferredTerm(int(p["weight"]), _term(p.get("preference") or {}))
        for p in node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    )
    tolerations = tuple(
        Toleration(
            t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""), t.get("effect", "")
        )
        for t in spec.get("tolerations") or ()
    )
    pod_labels = meta.get("labels") or {}
    return Pod(
        uid=meta["uid"],
        namespace=meta.get("namespace", "default"),
        name=meta["name"],
        scheduler_name=spec.get("schedulerName", "default-scheduler"),
        node_name=spec.get("nodeName", ""),
        priority=int(spec.get("priority") or 0),
        phase=status.get("phase", "Pending"),
        requests=requests,
        host_ports=ports,
        node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
        required_terms=required,
        preferred_terms=preferred,
        tolerations=tolerations,
        devices=devices,
        labels=tuple(sorted(pod_labels.items())),
        annotations=tuple(sorted((meta.get("annotations") or {}).items())),
        scheduling_gates=tuple(g["name"] for g in spec.get("schedulingGates") or ()),
        volumes=volumes.pod_volumes(meta["name"], spec),
        unsupported=_unsupported(spec),
        created=meta.get("creationTimestamp", ""),
        deleting=bool(meta.get("deletionTimestamp")),
        preemption_policy=spec.get("preemptionPolicy") or "PreemptLowerPriority",
        nominated_node=status.get("nominatedNodeName") or "",
        started=str(status.get("startTime") or ""),
        preempted=any(
            isinstance(c, dict)
            and c.get("type") == "DisruptionTarget"
            and c.get("status") == "True"
            and c.get("reason") == PREEMPTED_REASON
            for c in status.get("conditions") or ()
        ),
        affinity=terms.pod_affinity(spec.get("affinity"), meta.get("namespace", "default")),
        spread=terms.spread(spec.get("topologySpreadConstraints"), pod_labels),
        controller=terms.controller(meta),
        annotation_writers=annotation_writers(meta),
        scheduling_group=_group_name(spec.get("schedulingGroup")),
    )


POD_GROUP_SCHEDULED = "PodGroupInitiallyScheduled"
"""The PodGroup condition a scheduler sets: True once the group's scheduling requirement was
met (terminal), False with reason ``Unschedulable`` while it cannot be."""


def pod_group(raw: Json) -> PodGroup:
    """A ``scheduling.k8s.io/v1beta1`` PodGroup; raises ValueError/KeyError/TypeError on one
    the apiserver would not have admitted (no policy, both, a minCount below 1)."""
    meta, spec = raw["metadata"], raw.get("spec") or {}
    policy = spec.get("schedulingPolicy") or {}
    if ("gang" in policy) == ("basic" in policy):
        raise ValueError("spec.schedulingPolicy: exactly one of basic, gang")
    min_count = 0
    if "gang" in policy:
        min_count = (policy["gang"] or {})["minCount"]
        if type(min_count) is not int or min_count < 1:
            raise ValueError(f"spec.schedulingPolicy.gang.minCount={min_count!r}: not >= 1")
    topology = [
        t["key"]
        for t in (spec.get("schedulingConstraints") or {}).get("topology") or ()
        if isinstance(t, dict) and isinstance(t.get("key"), str)
    ]
    scheduled = any(
        isinstance(c, dict) and c.get("type") == POD_GROUP_SCHEDULED and c.get("status") == "True"
        for c in (raw.get("status") or {}).get("conditions") or ()
    )
    return PodGroup(
        namespace=meta.get("namespace", "default"),
        name=meta["name"],
        min_count=min_count,
        topology=topology[0] if topology else None,
        evicted_whole=min_count > 0 or "all" in (spec.get("disruptionMode") or {}),
        scheduled=scheduled,
        parent=str(spec.get("parentCompositePodGroupName") or ""),
    )


def node(raw: Json) -> Node:
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return Node(
        name=meta["name"],
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        allocatable=resources(status.get("allocatable")),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(
            Taint(t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or ()
        ),
    )


def confirms_allocations(raw: Json) -> bool:
    """Whether a device plugin keeps this NodeDevices object: it always writes
    ``status.observedAt``, and it marks each pod it allocated (docs/contracts.md). An inventory
    written by hand (KWOK nodes of tests and benchmarks) has none, and no pod there is marked."""
    return bool((raw.get("status") or {}).get("observedAt"))


MAX_DEVICE_MEMORY_BYTES = 16 * 2**40
"""No device has more memory than this (16 TiB, the device plugin's own bound on Runtime facts)."""


def _memory_gib(entry: Json, what: str, refused: list[str] | None) -> int | None:
    """The GiB of ``entry``'s ``memoryBytes``, or None (said in ``refused``) when it cannot be
    true: negative, not a whole number, above :data:`MAX_DEVICE_MEMORY_BYTES`."""
    raw = entry.get("memoryBytes", 0)
    ok = type(raw) is int or (type(raw) is float and raw.is_integer())
    if ok and 0 <= raw <= MAX_DEVICE_MEMORY_BYTES:
        return int(raw) // 2**30
    if refused is not None:
        refused.append(
            f"{what}: memoryBytes={str(raw)[:40]!r} is not a device's memory (a whole number of "
            f"bytes from 0 to {MAX_DEVICE_MEMORY_BYTES}); left out, nothing is placed on it"
        )
    return None


def node_devices(
    raw: Json, names: ResourceNames = DEFAULT_NAMES, refused: list[str] | None = None
) -> tuple[str, tuple[Device, ...]]:
    """(node name, devices) of a NodeDevices object.

    A MIG- or TDM-partitioned GPU is not a whole GPU: it becomes its partitions that the device
    plugin advertises as whole ``aliyun.com/gpu`` units (MIG strategy single, TDM slices).
    Partitions advertised under another resource (MIG strategy mixed) and GPUs bound to vfio-pci
    (``binding`` other than DRIVER; absent from an older device plugin means DRIVER) are not ours
    to place. A device or partition whose memory cannot be true is left out, and said in
    ``refused`` (so that no share of an impossible capacity is ever handed out).
    """
    node_name = (raw.get("spec") or {}).get("nodeName") or raw["metadata"]["name"]
    devices: list[Device] = []
    seen: set[str] = set()
    for i, d in enumerate((raw.get("status") or {}).get("devices") or ()):
        # One id, one device: a duplicated entry (a broken writer) would be handed out twice.
        if not isinstance(d.get("id"), str) or d["id"] in seen:
            continue
        seen.add(d["id"])
        if d.get("binding", "DRIVER") != "DRIVER":
            # Bound to vfio-pci (or a binding newer than this scheduler): the device plugin
            # advertises it under its own resource, never as aliyun.com/gpu; not ours to place.
            continue
        memory = _memory_gib(d, f"device {d['id']}", refused)
        if memory is None:
            continue
        dev = Device(
            id=d["id"],
            kind=d.get("kind", "GPU"),
            memory_gib=memory,
            # fenced: a partition layout change waits for it (docs/partitioning.md); the device
            # plugin then also reports it unhealthy, but a fence alone is enough to place nothing
            healthy=d.get("healthy") is True and not d.get("fenced"),
            numa=int(d.get("numaNode", -1)),
            island=int(d.get("nvlinkIsland", -1)),
            index=int(d.get("index", i)),
        )
        parts = d.get("partitions") or ()
        if d.get("partitionMode", "NONE") in ("MIG", "TDM") and parts:
            for p in parts:
                if p.get("resource", names.gpu) != names.gpu:
                    continue
                part_memory = _memory_gib(p, f"partition {p['id']} of {dev.id}", refused)
                if part_memory is None or 0 < memory < part_memory:
                    if part_memory is not None and refused is not None:
                        refused.append(
                            f"partition {p['id']} of {dev.id}: {part_memory} GiB is more than "
                            f"its GPU's {memory} GiB; left out, nothing is placed on it"
                        )
                    continue
                devices.append(
                    replace(
                        dev,
                        id=str(p["id"]),
                        memory_gib=part_memory,
                        healthy=dev.healthy and p.get("healthy") is True,
                        partition_of=dev.id,
                    )
                )
        else:
            devices.append(dev)
    return node_name, tuple(devices)
