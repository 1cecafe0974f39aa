"""The node's ResourceSlices (``resource.k8s.io/v1``) from the catalogue of :mod:`.offers`. Pure.

One pool per node (named after the node), one slice device per offer: whole GPUs and PPUs, and
partitions as :func:`.offers.offers` lists them (``static`` or ``dynamic``, docs/dra.md).

GPU shares are consumable capacity of the whole-GPU device itself (``allowMultipleAllocations``,
capacities ``cores`` and ``memory``, see :func:`share_capacity`), never a second device per GPU:
the scheduler then counts whole claims and shares against one ledger per GPU, so they cannot
collide on it, and no counter sets are needed.

Every object obeys the API's validation, so the apiserver never refuses a publish because of what
the Runtime reported: a value that does not fit its attribute (a string over 64 characters, a
version that is not semver) leaves that attribute out rather than be cut into a different one.

- device names are DNS labels derived from the Runtime's stable device ids
  (:func:`.offers.device_names`; the prepare path maps a claim's device back to the Runtime id
  with the same function);
- attribute and capacity names are C identifiers of at most 32 characters, in the driver's
  domain (no prefix), besides the standard ``resource.kubernetes.io/pcieRoot``; at most 32
  attributes and capacities per device together (at most 19 attributes and 2 capacities are
  written);
- an unhealthy device carries the taint ``lj-runtimekit.aliyun.com/unhealthy:NoSchedule`` with the
  Runtime's reason as value when it is a valid label value; a recovered one carries none;
- at most 128 devices per slice, 64 when any device of the pool is tainted or consumes counters
  (the API's lower limits); counter sets go in slices of their own (at most 8 each), since a slice
  holds devices or counters, never both; each slice names the pool's generation and slice count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..k8s_names import is_label_value
from ..model import GIB, Device
from ..topology import topology
from .offers import (
    CORES,
    CORES_WHOLE,
    DYNAMIC,
    MEMORY,
    MIG_COMPUTE_SLICES,
    MIN_SHARE_MEMORY,
    STATIC,
    Offer,
    dns_label,
    dynamic_mode,
    offers,
    shareable,
)

API_VERSION = "resource.k8s.io/v1"
DEFAULT_DRIVER = "lj-runtimekit.aliyun.com"
UNHEALTHY_TAINT_KEY = "lj-runtimekit.aliyun.com/unhealthy"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64
MAX_COUNTER_SETS_PER_SLICE = 8
#: Counter names (DNS labels) of a GPU's counter set.
COUNTER_COMPUTE = "compute-slices"
COUNTER_MEMORY = "memory"
COUNTER_TIME = "time-percent"

# Semantic Versioning 2.0.0, the format of a version attribute.
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-((0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(\+([0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*))?\Z"
)
_NUMBERS = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?\Z")
#: The standard attribute of the PCIe root complex above a device (Kubernetes' DRA drivers
#: publish it so a claim can align devices of several drivers, e.g. a GPU and a NIC, with
#: matchAttribute); a sysfs root name such as "pci0000:00".
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}\Z")


@dataclass(frozen=True)
class NodeFacts:
    """What the slices say besides the devices: the node, the driver stack, the pool version."""

    node: str
    generation: int = 1
    """The pool's generation: the publisher raises it whenever the content changes."""
    node_uid: str = ""
    """With it the slices are owned by the Node and go when the Node goes."""
    driver: str = DEFAULT_DRIVER
    driver_version: str = ""
    runtime_version: str = ""
    compute_capability: Mapping[str, str] = field(default_factory=dict)
    """Runtime device id → compute capability ("9.0")."""
    partitions: str = STATIC
    """How partitions are published: ``static`` (as the Runtime has them) or ``dynamic`` (every
    partition that could be made, on demand; see :func:`.offers.offers`)."""
    device_taints: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)
    """Runtime device id → taints besides health, on every device published for it (a GPU that a
    device-plugin pod still holds after its node moved to DRA, :mod:`..handover`)."""
    topology: Mapping[str, str] = field(default_factory=dict)
    """The node's network-topology labels (``network.topology/block`` → ``b1``), an attribute of
    every device under the label's own key: a claim's selector can pick a block or rack."""


def semver(text: str) -> str | None:
    """``text`` as a semver version ("9.0" → "9.0.0", "535.104.05" → "535.104.5"), or None."""
    text = text.strip()
    if _SEMVER.match(text) and len(text) <= MAX_STRING_ATTRIBUTE:
        return text
    m = _NUMBERS.match(text)
    if not m:
        return None
    version = ".".join(str(int(part or 0)) for part in m.groups())
    return version if len(version) <= MAX_STRING_ATTRIBUTE else None


def _quantity(n_bytes: int) -> str:
    return f"{n_bytes // GIB}Gi" if n_bytes % GIB == 0 else str(n_bytes)


def _attributes(d: Device, facts: NodeFacts, island: int, switch: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {"type": {"string": d.kind}, "index": {"int": d.index}}
    for name, value in (
        ("runtimeDeviceID", d.id),
        ("uuid", d.uuid),
        ("vendor", d.vendor),
        ("model", d.model),
        ("pciBusID", d.pci_bus_id),
        ("partitionMode", d.partition_mode),
    ):
        if value and len(value) <= MAX_STRING_ATTRIBUTE:
            attrs[name] = {"string": value}
    if d.numa_node >= 0:
        attrs["numaNode"] = {"int": d.numa_node}
    attrs["nvlinkIsland"] = {"int": island}
    attrs["pcieSwitch"] = {"int": switch}
    if d.compute_units > 0:
        attrs["computeUnits"] = {"int": d.compute_units}
    if _PCIE_ROOT.match(d.pcie_root):
        attrs[PCIE_ROOT] = {"string": d.pcie_root}
    for name, raw in (
        ("computeCapability", facts.compute_capability.get(d.id, "")),
        ("driverVersion", facts.driver_version),
        ("runtimeVersion", facts.runtime_version),
    ):
        if raw and (version := semver(raw)):
            attrs[name] = {"version": version}
    for key, value in sorted(facts.topology.items()):
        if value and len(value) <= MAX_STRING_ATTRIBUTE:
            attrs[key] = {"string": value}
    return attrs


def share_capacity(memory_bytes: int) -> dict[str, Any]:
    """The consumable capacity of a shareable GPU of ``memory_bytes``.

    Every request policy's ``default`` is the whole capacity: a request that names no capacity
    (a claim for a whole GPU, a pod asking ``aliyun.com/gpu`` through the extended-resource
    mapping) consumes all of the GPU, so the scheduler never puts it beside a share, nor a share
    beside it. A share names ``cores`` (percent, whole numbers 1..100) and ``memory`` (bytes,
    at least 1 MiB); one it leaves out it takes whole. The preparer tells the two apart by what
    a result consumed (:mod:`.prepare` asks the Runtime for a whole GPU when it is all).
    """
    memory = _quantity(memory_bytes)
    return {
        CORES: {
            "value": str(CORES_WHOLE),
            "requestPolicy": {
                "default": str(CORES_WHOLE),
                "validRange": {"min": "1", "max": str(CORES_WHOLE), "step": "1"},
            },
        },
        MEMORY: {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": "1Mi"}},
        },
    }


def _taints(d: Device) -> list[dict[str, str]]:
    if d.healthy:
        return []
    taint = {"key": UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}
    if d.reason and is_label_value(d.reason):
        taint["value"] = d.reason
    return [taint]


def _counters(d: Device) -> dict[str, str]:
    """All of a GPU's counter set: what its whole device consumes."""
    if dynamic_mode(d) == "mig":
        memory = 8 * (d.memory_gib // 8) * GIB
        return {COUNTER_COMPUTE: str(MIG_COMPUTE_SLICES), COUNTER_MEMORY: _quantity(memory)}
    return {COUNTER_TIME: "100"}


def _consumes(o: Offer) -> dict[str, str]:
    if o.kind == "whole":
        return _counters(o.device)
    if o.kind == "mig":
        return {COUNTER_COMPUTE: str(o.compute_slices), COUNTER_MEMORY: _quantity(o.memory_bytes)}
    return {COUNTER_TIME: str(o.percent)}


def _partition_taints(o: Offer) -> list[dict[str, str]]:
    part = next((p for p in o.device.partitions if p.id == o.partition_id), None)
    if part is None or part.healthy:
        return _taints(o.device)
    taint = {"key": UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}
    if part.reason and is_label_value(part.reason):
        taint["value"] = part.reason
    return [taint]


def _entry(o: Offer, facts: NodeFacts, island: int, switch: int) -> dict[str, Any]:
    d = o.device
    attrs = _attributes(d, facts, island, switch)
    entry: dict[str, Any] = {"name": o.name, "attributes": attrs}
    if o.kind == "whole":
        if o.counter_set:
            attrs["partitionMode"] = {"string": DYNAMIC}
        if shareable(d) or (o.counter_set and d.memory_bytes >= MIN_SHARE_MEMORY):
            entry["allowMultipleAllocations"] = True
            entry["capacity"] = share_capacity(d.memory_bytes)
        elif d.memory_bytes > 0:
            entry["capacity"] = {MEMORY: {"value": _quantity(d.memory_bytes)}}
        taints = _taints(d)
    else:
        mode = o.kind if o.on_demand else d.partition_mode
        attrs["type"] = {"string": mode}
        attrs["partitionMode"] = {"string": mode}
        attrs["profile"] = {"string": o.profile}
        if o.kind == "partition" and len(o.partition_id) <= MAX_STRING_ATTRIBUTE:
            attrs["partitionID"] = {"string": o.partition_id}
        if o.compute_slices:
            attrs["computeSlices"] = {"int": o.compute_slices}
        if o.percent:
            attrs["timePercent"] = {"int": o.percent}
        attrs.pop("computeUnits", None)
        part = next((p for p in d.partitions if p.id == o.partition_id), None)
        if part is not None and part.compute_units > 0:
            attrs["computeUnits"] = {"int": part.compute_units}
        if o.memory_bytes > 0:
            entry["capacity"] = {MEMORY: {"value": _quantity(o.memory_bytes)}}
        taints = _partition_taints(o) if o.kind == "partition" else _taints(d)
    if o.counter_set:
        entry["consumesCounters"] = [{"counterSet": o.counter_set, "counters": {
            name: {"value": value} for name, value in _consumes(o).items()
        }}]  # fmt: skip
    taints = [*taints, *(dict(t) for t in facts.device_taints.get(d.id, ()))]
    if taints:
        entry["taints"] = taints
    return entry


def dra_devices(devices: Sequence[Device], facts: NodeFacts) -> list[dict[str, Any]]:
    """The DRA devices of the node, in the order of :func:`.offers.offers`."""
    return _entries(offers(devices, facts.partitions), facts)


def _entries(all_offers: Sequence[Offer], facts: NodeFacts) -> list[dict[str, Any]]:
    topo = topology(list({o.device.id: o.device for o in all_offers}.values()))
    return [
        _entry(o, facts, topo.island[o.device.id], topo.switch[o.device.id]) for o in all_offers
    ]


def counter_sets(devices: Sequence[Device], facts: NodeFacts) -> list[dict[str, Any]]:
    """The pool's counter sets: one per GPU that offers partitions on demand."""
    return _sets(offers(devices, facts.partitions))


def _sets(all_offers: Sequence[Offer]) -> list[dict[str, Any]]:
    return [
        {
            "name": o.counter_set,
            "counters": {n: {"value": v} for n, v in _counters(o.device).items()},
        }
        for o in all_offers
        if o.kind == "whole" and o.counter_set
    ]


def slice_name(node: str, driver: str, index: int) -> str:
    """A stable object name per (node, driver, index): republishing updates, never duplicates."""
    return f"{dns_label(f'{node}-{driver}', 240)}-{index}"


def resource_slices(devices: Sequence[Device], facts: NodeFacts) -> list[dict[str, Any]]:
    """The node's ResourceSlice objects; none when it has no device to publish.

    A publisher creates or updates these by name and deletes the node's other slices of this
    driver (a shrinking pool).
    """
    all_offers = offers(devices, facts.partitions)  # once: devices and counter sets
    entries = _entries(all_offers, facts)
    if not entries:
        return []
    per_slice = (
        MAX_DEVICES_PER_SLICE_WITH_TAINTS
        if any("taints" in e or "consumesCounters" in e for e in entries)
        else MAX_DEVICES_PER_SLICE
    )
    sets = _sets(all_offers)
    chunks: list[dict[str, Any]] = [
        {"devices": entries[i : i + per_slice]} for i in range(0, len(entries), per_slice)
    ]
    chunks += [
        {"sharedCounters": sets[i : i + MAX_COUNTER_SETS_PER_SLICE]}
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    metadata_owner: dict[str, Any] = {}
    if facts.node_uid:
        metadata_owner["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": facts.node,
                "uid": facts.node_uid,
                "controller": True,
            }
        ]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(facts.node, facts.driver, i), **metadata_owner},
            "spec": {
                "driver": facts.driver,
                "nodeName": facts.node,
                "pool": {
                    "name": facts.node,
                    "generation": facts.generation,
                    "resourceSliceCount": len(chunks),
                },
                **chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
