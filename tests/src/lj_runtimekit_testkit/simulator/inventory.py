"""The simulated node's device inventory as plain data, and the partitioning rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

GIB = 1024**3
MIG_SLICES = 7
_MIG_PROFILE = re.compile(r"^([1-7])g\.([1-9][0-9]*)gb$")
#: The driver stack GetVersion reports when the inventory names none: an NVIDIA data-centre driver
#: of the 550 branch (CUDA 12.4), what H800/A100 nodes of this era run.
DEFAULT_DRIVER_VERSION = "550.54.15"
#: NVIDIA compute capability by GPU family (NVIDIA's public "CUDA GPUs" table), matched as a word
#: in the model name; the first match wins, so longer names come before their prefixes.
_COMPUTE_CAPABILITY = (
    (re.compile(r"\b(H100|H800|H200|H20|GH200)\b"), "9.0"),
    (re.compile(r"\b(L40S|L40|L20|L4)\b"), "8.9"),
    (re.compile(r"\b(A100|A800|A30)\b"), "8.0"),
    (re.compile(r"\b(A10|A40|A16|A2)\b"), "8.6"),
    (re.compile(r"\bT4\b"), "7.5"),
    (re.compile(r"\bV100\b"), "7.0"),
)


def compute_capability_of(kind: Kind, model: str) -> str:
    """The compute capability a GPU of ``model`` has; "" when not an NVIDIA model we know
    (PPUs, AMD: the Runtime reports none for them unless the inventory says so)."""
    if kind is not Kind.GPU:
        return ""
    return next((cc for rx, cc in _COMPUTE_CAPABILITY if rx.search(model)), "")


class InventoryError(ValueError):
    """The inventory file is missing or malformed; the message names the file and field."""


class Kind(Enum):
    GPU = "gpu"
    PPU = "ppu"
    AMD = "amd"
    OTHER = "other"


class LinkKind(Enum):
    NVLINK = "nvlink"
    PCIE_SWITCH = "pcie_switch"
    PCIE_HOST_BRIDGE = "pcie_host_bridge"
    SYSTEM = "system"


class Mode(Enum):
    NONE = "none"
    MIG = "mig"
    TDM = "tdm"


class Binding(Enum):
    """The host driver a device is bound to: the vendor's, or vfio-pci for pass-through."""

    DRIVER = "driver"
    VFIO = "vfio"


#: A device's IOMMU group when the inventory names none: a stable number from its index, offset
#: so that a client that confuses the two (``/dev/vfio/<index>``) is caught by the tests.
IOMMU_GROUP_BASE = 16
VFIO_CONTROL_NODE = "/dev/vfio/vfio"


@dataclass(frozen=True)
class Link:
    peer_id: str
    kind: LinkKind
    bandwidth_gbps: float
    lanes: int = 0


@dataclass(frozen=True)
class Health:
    healthy: bool = True
    reason: str = ""


@dataclass(frozen=True)
class Partition:
    id: str
    profile: str
    memory_bytes: int
    compute_units: int
    time_percent: int = 0
    health: Health = Health()


@dataclass(frozen=True)
class Device:
    id: str
    uuid: str
    index: int
    kind: Kind
    vendor: str
    model: str
    memory_bytes: int
    compute_units: int
    numa_node: int
    pci_bus_id: str
    device_nodes: tuple[str, ...]
    supports: frozenset[Mode] = frozenset()
    links: tuple[Link, ...] = ()
    mode: Mode = Mode.NONE
    partitions: tuple[Partition, ...] = ()
    health: Health = Health()
    compute_capability: str = ""
    binding: Binding = Binding.DRIVER
    iommu_group: int = -1
    """-1: IOMMU_GROUP_BASE + index (see :attr:`group`)."""
    pcie_root: str = ""
    """The PCIe root complex above the device (sysfs ``pci<domain>:<bus>``); "" when unknown."""

    @property
    def group(self) -> int:
        return self.iommu_group if self.iommu_group >= 0 else IOMMU_GROUP_BASE + self.index

    @property
    def nodes(self) -> tuple[str, ...]:
        """The device nodes the Runtime reports: the driver's, or the IOMMU group's under vfio
        (the vendor's nodes vanish when vfio-pci takes the device)."""
        if self.binding is Binding.VFIO:
            return (f"/dev/vfio/{self.group}",)
        return self.device_nodes


@dataclass(frozen=True)
class Inventory:
    node: str
    runtime_version: str
    devices: tuple[Device, ...]
    driver_version: str = DEFAULT_DRIVER_VERSION
    control_device_nodes: tuple[str, ...] = ()
    features: tuple[str, ...] = ("device-injection", "sharing", "monitoring")
    features_enabled: bool = False
    source: str = field(default="<memory>", compare=False)

    def device(self, device_id: str) -> Device | None:
        return next((d for d in self.devices if d.id == device_id), None)


def partitions_for(
    device_id: str,
    memory_bytes: int,
    compute_units: int,
    mode: Mode,
    specs: Sequence[str] | Sequence[int],
    *,
    where: str = "",
) -> tuple[Partition, ...]:
    """Partitions of one device for MIG profiles or TDM slice percents; raises InventoryError.

    Guarantees: MIG slices sum to at most 7 and memory to at most the device's; TDM percents are
    1..100 and sum to at most 100; ids are unique on the node and stable for the same spec.
    """
    where = where or device_id
    if mode is Mode.NONE:
        if specs:
            raise InventoryError(f"{where}: partitions given but mode is none")
        return ()
    if not specs:
        raise InventoryError(f"{where}: mode {mode.value} needs at least one partition")
    if mode is Mode.MIG:
        return _mig_partitions(device_id, memory_bytes, compute_units, specs, where)
    return _tdm_partitions(device_id, memory_bytes, compute_units, specs, where)


def _mig_partitions(
    device_id: str,
    memory_bytes: int,
    compute_units: int,
    specs: Sequence[str] | Sequence[int],
    where: str,
) -> tuple[Partition, ...]:
    out: list[Partition] = []
    slices = mem = 0
    seen: dict[str, int] = {}
    for raw in specs:
        spec = raw if isinstance(raw, str) else repr(raw)
        match = _MIG_PROFILE.match(spec)
        if match is None:
            raise InventoryError(f"{where}: MIG profile {spec!r} is not like '3g.40gb'")
        g, gb = int(match[1]), int(match[2])
        slices, mem = slices + g, mem + gb * GIB
        n = seen.get(spec, 0)
        seen[spec] = n + 1
        part_id = f"{device_id}-mig-{spec}-{n}"
        out.append(Partition(part_id, spec, gb * GIB, compute_units * g // MIG_SLICES))
    if slices > MIG_SLICES:
        raise InventoryError(f"{where}: MIG profiles use {slices} compute slices, at most 7 exist")
    if mem > memory_bytes:
        raise InventoryError(
            f"{where}: MIG profiles need {mem // GIB} GiB, the device has {memory_bytes // GIB} GiB"
        )
    return tuple(out)


def _tdm_partitions(
    device_id: str,
    memory_bytes: int,
    compute_units: int,
    specs: Sequence[str] | Sequence[int],
    where: str,
) -> tuple[Partition, ...]:
    out: list[Partition] = []
    for i, pct in enumerate(specs):
        if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
            raise InventoryError(f"{where}: TDM slice {pct!r} must be a percent from 1 to 100")
        out.append(
            Partition(
                f"{device_id}-tdm-{i}",
                f"tdm-{pct}",
                memory_bytes * pct // 100,
                compute_units,
                time_percent=pct,
            )
        )
    total = sum(p.time_percent for p in out)
    if total > 100:
        raise InventoryError(f"{where}: TDM slices sum to {total}%, at most 100% exist")
    return tuple(out)
