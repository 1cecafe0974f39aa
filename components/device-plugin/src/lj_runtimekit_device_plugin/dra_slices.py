"""The node's ResourceSlices (``resource.k8s.io/v1``) from the Runtime's inventory. Pure.

One pool per node (named after the node), one DRA device per whole GPU or PPU bound to its
vendor driver. Partitions (MIG, TDM) and GPUs bound to vfio-pci are not published yet (docs/dra.md).

GPU shares are consumable capacity of the whole-GPU device itself (``allowMultipleAllocations``,
capacities ``cores`` and ``memory``, see :func:`share_capacity`), never a second device per GPU:
the scheduler then counts whole claims and shares against one ledger per GPU, so they cannot
collide on it, and no counter sets are needed.

Every object obeys the API's validation, so the apiserver never refuses a publish because of what
the Runtime reported: a value that does not fit its attribute (a string over 64 characters, a
version that is not semver) leaves that attribute out rather than be cut into a different one.

- device names are DNS labels derived from the Runtime's stable device ids (:func:`device_names`;
  the prepare path maps a claim's device back to the Runtime id with the same function);
- attribute and capacity names are C identifiers of at most 32 characters, in the driver's
  domain (no prefix); at most 32 attributes and capacities per device together (at most 15
  attributes and 2 capacities are written);
- an unhealthy device carries the taint ``lj-runtimekit.aliyun.com/unhealthy:NoSchedule`` with the
  Runtime's reason as value when it is a valid label value; a recovered one carries none;
- at most 128 devices per slice, 64 when any device of the pool is tainted (the API's lower limit
  for slices with taints); each slice names the pool's generation and slice count.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import GIB, Device
from .topology import topology

API_VERSION = "resource.k8s.io/v1"
DEFAULT_DRIVER = "lj-runtimekit.aliyun.com"
UNHEALTHY_TAINT_KEY = "lj-runtimekit.aliyun.com/unhealthy"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64
PUBLISHED_KINDS = ("gpu", "ppu")
#: Capacity names of a shareable GPU: percent of its compute, and bytes of its memory.
CORES = "cores"
MEMORY = "memory"
CORES_WHOLE = 100
#: The smallest memory a share consumes: a share of no memory would be no limit at all.
MIN_SHARE_MEMORY = 1 << 20

_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?\Z")
# Semantic Versioning 2.0.0, the format of a version attribute.
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-((0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(\+([0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*))?\Z"
)
_NUMBERS = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?\Z")


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


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _dns_label(text: str, max_len: int = 63) -> str:
    """``text`` as a DNS label; a digest is added whenever the text had to change, so two ids
    that read alike after the change still get different names."""
    clean = _DNS_LABEL_BAD.sub("-", text.lower()).strip("-")
    if clean == text and 0 < len(clean) <= max_len:
        return clean
    suffix = _digest(text)
    head = clean[: max_len - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}" if head else suffix


def device_names(devices: Iterable[Device]) -> dict[str, str]:
    """Runtime device id → DRA device name (a DNS label, unique among ``devices``, stable)."""
    return {d.id: _dns_label(d.id) for d in devices}


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
    for name, raw in (
        ("computeCapability", facts.compute_capability.get(d.id, "")),
        ("driverVersion", facts.driver_version),
        ("runtimeVersion", facts.runtime_version),
    ):
        if raw and (version := semver(raw)):
            attrs[name] = {"version": version}
    return attrs


def shareable(d: Device) -> bool:
    """Whether claims may share ``d`` (the Runtime's ``gpu-core``/``gpu-memory`` allocations):
    a GPU on its driver, not partitioned (the Runtime allocates a partitioned GPU only by its
    partitions), with a memory size to share."""
    return (
        d.kind == "gpu"
        and d.binding == "driver"
        and not d.partitions
        and d.memory_bytes >= MIN_SHARE_MEMORY
    )


def share_capacity(memory_bytes: int) -> dict[str, Any]:
    """The consumable capacity of a shareable GPU of ``memory_bytes``.

    Every request policy's ``default`` is the whole capacity: a request that names no capacity
    (a claim for a whole GPU, a pod asking ``aliyun.com/gpu`` through the extended-resource
    mapping) consumes all of the GPU, so the scheduler never puts it beside a share, nor a share
    beside it. A share names ``cores`` (percent, whole numbers 1..100) and ``memory`` (bytes,
    at least 1 MiB); one it leaves out it takes whole. The preparer tells the two apart by what
    a result consumed (:mod:`.dra_prepare` asks the Runtime for a whole GPU when it is all).
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
    if d.reason and _LABEL_VALUE.match(d.reason):
        taint["value"] = d.reason
    return [taint]


def dra_devices(devices: Sequence[Device], facts: NodeFacts) -> list[dict[str, Any]]:
    """The DRA devices of the node, in the Runtime's order (index, then id)."""
    published = sorted(
        (d for d in devices if d.kind in PUBLISHED_KINDS and d.binding == "driver"),
        key=lambda d: (d.index, d.id),
    )
    topo = topology(published)
    names = device_names(published)
    out = []
    for d in published:
        entry: dict[str, Any] = {
            "name": names[d.id],
            "attributes": _attributes(d, facts, topo.island[d.id], topo.switch[d.id]),
        }
        if shareable(d):
            entry["allowMultipleAllocations"] = True
            entry["capacity"] = share_capacity(d.memory_bytes)
        elif d.memory_bytes > 0:
            entry["capacity"] = {MEMORY: {"value": _quantity(d.memory_bytes)}}
        if taints := _taints(d):
            entry["taints"] = taints
        out.append(entry)
    return out


def slice_name(node: str, driver: str, index: int) -> str:
    """A stable object name per (node, driver, index): republishing updates, never duplicates."""
    return f"{_dns_label(f'{node}-{driver}', 240)}-{index}"


def resource_slices(devices: Sequence[Device], facts: NodeFacts) -> list[dict[str, Any]]:
    """The node's ResourceSlice objects; none when it has no device to publish.

    A publisher creates or updates these by name and deletes the node's other slices of this
    driver (a shrinking pool).
    """
    entries = dra_devices(devices, facts)
    if not entries:
        return []
    per_slice = (
        MAX_DEVICES_PER_SLICE_WITH_TAINTS
        if any("taints" in e for e in entries)
        else MAX_DEVICES_PER_SLICE
    )
    chunks = [entries[i : i + per_slice] for i in range(0, len(entries), per_slice)]
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
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
