"""Plain data of the device plugin: the Runtime's devices as the domain sees them, and which of
the Runtime's device facts can be believed (:func:`screen`). Pure: data in, data out (and a log).

:mod:`runtime` converts protobuf messages to these once; everything else reads only these.

The Runtime is vendor code outside this process; what it reports becomes unit ids the kubelet
counts. A fact that would repeat a unit id, forge one (``::``), or advertise an absurd number of
units is left out by :func:`screen`, with a log naming the device, before it reaches the inventory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

GIB = 1 << 30


@dataclass(frozen=True)
class Link:
    """A connection from one device to a peer."""

    peer_id: str
    type: str
    """nvlink, pcie_switch, pcie_host_bridge, system, unspecified or unknown (a newer value)."""
    bandwidth_gbps: float = 0.0


@dataclass(frozen=True)
class Partition:
    """A MIG instance or a TDM slice of a device."""

    id: str
    profile: str
    memory_bytes: int = 0
    compute_units: int = 0
    time_percent: int = 0
    healthy: bool = True
    reason: str = ""


@dataclass(frozen=True)
class Device:
    """One accelerator, with its health and partitioning."""

    id: str
    uuid: str = ""
    index: int = 0
    kind: str = "gpu"
    """gpu, ppu, amd, other, unspecified or unknown (a newer value)."""
    vendor: str = ""
    model: str = ""
    memory_bytes: int = 0
    compute_units: int = 0
    numa_node: int = -1
    pci_bus_id: str = ""
    links: tuple[Link, ...] = ()
    partition_mode: str = "none"
    """none, mig, tdm (unspecified or unknown read as none)."""
    partitions: tuple[Partition, ...] = ()
    healthy: bool = True
    reason: str = ""
    device_nodes: tuple[str, ...] = ()
    binding: str = "driver"
    """driver (the vendor's; also from a Runtime older than the field) or vfio (vfio-pci, for
    pass-through: device_nodes are then its /dev/vfio/<IOMMU group>); unknown (a newer value)."""
    pcie_root: str = ""
    """The PCIe root complex above the device (sysfs ``pci<domain>:<bus>``); "" when unknown."""
    partition_modes: frozenset[str] = frozenset()
    """The partition modes (``mig``, ``tdm``) the device can be switched to; empty when it cannot
    be partitioned, and from a Runtime older than the field."""

    @property
    def vfio(self) -> bool:
        return self.binding == "vfio"

    @property
    def memory_gib(self) -> int:
        """Whole GiB of memory: the device's gpu-memory units."""
        return self.memory_bytes // GIB


@dataclass(frozen=True)
class RuntimeInfo:
    """What GetVersion said."""

    version: str = ""
    api_version: str = ""
    capabilities: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Injection:
    """What a container gets for its devices, for the lj-runtime handler."""

    envs: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    device_nodes: tuple[tuple[str, str, str], ...] = ()
    """(container path, host path, permissions)."""
    mounts: tuple[tuple[str, str, bool], ...] = ()
    """(container path, host path, read only)."""


@dataclass(frozen=True)
class Allocation:
    """One allocation the Runtime made."""

    id: str
    device_ids: tuple[str, ...]
    injection: Injection
    core_percent: int = 0
    memory_bytes: int = 0
    pod: tuple[str, str, str] = ("", "", "")
    """(namespace, name, uid) of the owner the Runtime recorded."""
    container: str = ""
    resource: str = ""
    """The extended resource it was made for."""

    @property
    def shared(self) -> bool:
        return self.core_percent > 0 or self.memory_bytes > 0


#: More memory than any accelerator has (16 TiB): a Runtime claiming it is misreporting, and
#: believing it would advertise one gpu-memory unit per GiB (2^34 units for 2^64-1 bytes).
MAX_DEVICE_MEMORY_BYTES = 16 << 40
#: More devices than any node holds: the rest of a longer list is left out (bounded memory: each
#: GPU advertises 100 gpu-core units and one gpu-memory unit per GiB).
MAX_DEVICES = 256
#: Unit ids are ``<device id>::core-<n>``/``::mem-<n>``: an id with ``::`` could forge another's.
RESERVED_ID_PART = "::"


def screen(
    devices: Iterable[Device], *, taken: Iterable[str] = (), limit: int = MAX_DEVICES
) -> list[Device]:
    """The devices whose facts can be believed; each one left out is logged with why.

    Guarantees: every device and partition id is non-empty, free of ``::`` and unique among all
    of them (unit ids, hence what the kubelet counts, stay unique); no device claims more than
    :data:`MAX_DEVICE_MEMORY_BYTES`; at most ``limit`` devices. ``taken``: ids that other
    devices already hold (the rest of the inventory, when an event adds some).
    """
    devices = list(devices)
    seen: dict[str, int] = dict.fromkeys(taken, 1)
    for d in devices:
        for i in ids_of(d):
            seen[i] = seen.get(i, 0) + 1
    kept = []
    for d in devices:
        ids = ids_of(d)
        why = ""
        if any(not i or RESERVED_ID_PART in i for i in ids):
            why = f"empty id or one containing {RESERVED_ID_PART!r}"
        elif any(seen[i] > 1 for i in ids):
            why = "its id or a partition id is repeated"
        elif any(m > MAX_DEVICE_MEMORY_BYTES for m in (d.memory_bytes, *memory_of(d))):
            why = f"memory_bytes {d.memory_bytes} is beyond any real device"
        if why:
            log.error(
                "runtime_device_rejected",
                device=d.id,
                partitions=[p.id for p in d.partitions],
                why=why,
                effect="the device is not advertised until the Runtime reports it sanely",
            )
            continue
        kept.append(d)
    if len(kept) > limit:
        kept.sort(key=lambda d: (d.index, d.id))
        log.error(
            "runtime_devices_truncated",
            reported=len(kept),
            kept=limit,
            left_out=[d.id for d in kept[limit:]][:20],
            effect="only the first devices by index are advertised",
        )
        kept = kept[:limit]
    return kept


def memory_of(d: Device) -> tuple[int, ...]:
    return tuple(p.memory_bytes for p in d.partitions)


def ids_of(d: Device) -> tuple[str, ...]:
    """The device's id and its partitions' ids: each becomes a unit id."""
    return (d.id, *(p.id for p in d.partitions))
