"""Plain data of the device plugin: the Runtime's devices as the domain sees them. Pure.

:mod:`runtime` converts protobuf messages to these once; everything else reads only these. Which
of the Runtime's facts can be believed is :mod:`domains`' to say, before they reach the inventory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    fenced: str = ""
    """Why the device is fenced from new pods (a partition layout change waits for it; set only
    by :func:`.fence.overlay`, which also makes it unhealthy); empty when it is not."""

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
