"""The strict loader of inventory YAML files (``version: v1``, see ``tests/inventories/README.md``).

Unknown keys, wrong types, duplicate ids and links to unknown peers are refused; every message
names the file and the field, so a broken inventory is fixed in one look.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lj_runtimekit_testkit.simulator.inventory import (
    DEFAULT_DRIVER_VERSION,
    GIB,
    Binding,
    Device,
    Health,
    Inventory,
    InventoryError,
    Kind,
    Link,
    LinkKind,
    Mode,
    compute_capability_of,
    partitions_for,
)

#: Points at a folder of inventories instead of ``tests/inventories/``.
INVENTORY_DIR_ENV = "LJ_RUNTIME_SIM_INVENTORY_DIR"
E = TypeVar("E", Kind, LinkKind, Mode, Binding)
_TOP_KEYS = {
    "version",
    "node",
    "runtime_version",
    "driver_version",
    "control_device_nodes",
    "features",
    "features_enabled",
    "defaults",
    "devices",
    "topology",
}
_DEVICE_KEYS = {
    "id",
    "uuid",
    "index",
    "kind",
    "vendor",
    "model",
    "memory_gib",
    "compute_units",
    "numa_node",
    "pci_bus_id",
    "device_nodes",
    "supports",
    "partitioning",
    "health",
    "compute_capability",
    "binding",
    "iommu_group",
    "pcie_root",
}
_DEFAULT_NODES = {
    Kind.GPU: "/dev/nvidia{i}",
    Kind.PPU: "/dev/alixpu{i}",
    Kind.AMD: "/dev/dri/renderD{r}",
    Kind.OTHER: "/dev/accel{i}",
}


def inventory_dir() -> Path:
    """``$LJ_RUNTIME_SIM_INVENTORY_DIR``, else ``tests/inventories/`` of this repository."""
    override = os.environ.get(INVENTORY_DIR_ENV)
    if override:
        return Path(override)
    # tests/src/lj_runtimekit_testkit/simulator/inventory_file.py -> tests/inventories
    return Path(__file__).resolve().parents[3] / "inventories"


def load_inventory(name_or_path: str | Path) -> Inventory:
    """Load an inventory by bare name (``gpu-8x-nvlink``) or by path; raises InventoryError."""
    text = str(name_or_path)
    path = Path(text)
    if "/" not in text and not text.endswith((".yaml", ".yml")):
        path = inventory_dir() / f"{text}.yaml"
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InventoryError(f"inventory {text!r}: cannot read {path}: {e.strerror}") from e
    return parse_inventory(raw, source=str(path))


def parse_inventory(text: str, source: str = "<string>") -> Inventory:
    """Parse inventory YAML; every problem is an InventoryError naming ``source`` and the field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InventoryError(f"{source}: not valid YAML: {e}") from e
    top = _mapping(doc, source, _TOP_KEYS)
    if top.get("version") != "v1":
        raise InventoryError(f"{source}: version: expected 'v1', got {top.get('version')!r}")
    node = _str(top.get("node", "sim-node"), f"{source}: node")
    defaults = _mapping(top.get("defaults", {}), f"{source}: defaults", _DEVICE_KEYS - {"id"})
    raw_devices = top.get("devices")
    if not isinstance(raw_devices, list) or not raw_devices:
        raise InventoryError(f"{source}: devices: expected a non-empty list")
    devices = [
        _device(
            {**defaults, **_mapping(d, f"{source}: devices[{i}]", _DEVICE_KEYS)},
            i,
            node,
            f"{source}: devices[{i}]",
        )
        for i, d in enumerate(raw_devices)
    ]
    _check_unique(devices, source)
    links = _topology(top.get("topology", []), {d.id for d in devices}, f"{source}: topology")
    devices = [_with_links(d, links) for d in devices]
    features = top.get("features", ["device-injection", "sharing", "monitoring"])
    return Inventory(
        node=node,
        runtime_version=_str(top.get("runtime_version", "v1.13.0"), f"{source}: runtime_version"),
        devices=tuple(devices),
        driver_version=_str(
            top.get("driver_version", DEFAULT_DRIVER_VERSION),
            f"{source}: driver_version",
            empty=True,
        ),
        control_device_nodes=tuple(
            _str_list(top.get("control_device_nodes", []), f"{source}: control_device_nodes")
        ),
        features=tuple(_str_list(features, f"{source}: features")),
        features_enabled=_bool(top.get("features_enabled", False), f"{source}: features_enabled"),
        source=source,
    )


def _device(raw: Mapping[str, Any], position: int, node: str, where: str) -> Device:
    dev_id = _str(raw.get("id"), f"{where}.id")
    kind = _enum(Kind, raw.get("kind", "gpu"), f"{where}.kind")
    index = _int(raw.get("index", position), f"{where}.index", minimum=0)
    memory = _number(raw.get("memory_gib"), f"{where}.memory_gib")
    units = _int(raw.get("compute_units"), f"{where}.compute_units", minimum=1)
    supports = frozenset(
        _enum(Mode, m, f"{where}.supports")
        for m in _str_list(raw.get("supports", []), f"{where}.supports")
    )
    part = _mapping(
        raw.get("partitioning", {"mode": "none"}),
        f"{where}.partitioning",
        {"mode", "profiles", "slices"},
    )
    mode = _enum(Mode, part.get("mode", "none"), f"{where}.partitioning.mode")
    if mode is not Mode.NONE and mode not in supports:
        raise InventoryError(f"{where}.partitioning: mode {mode.value} not in supports")
    if "profiles" in part and "slices" in part:
        raise InventoryError(f"{where}.partitioning: MIG profiles and TDM slices on one device")
    specs = part.get("profiles", part.get("slices", []))
    if not isinstance(specs, list):
        raise InventoryError(f"{where}.partitioning: profiles/slices must be a list")
    if (mode is Mode.MIG and "slices" in part) or (mode is Mode.TDM and "profiles" in part):
        raise InventoryError(
            f"{where}.partitioning: {mode.value} takes "
            f"{'profiles' if mode is Mode.MIG else 'slices'}"
        )
    binding = _enum(Binding, raw.get("binding", "driver"), f"{where}.binding")
    if binding is Binding.VFIO and mode is not Mode.NONE:
        raise InventoryError(
            f"{where}.binding: a vfio-bound device is passed through whole; "
            f"it cannot be in {mode.value} mode"
        )
    memory_bytes = int(memory * GIB)
    health = _mapping(raw.get("health", {}), f"{where}.health", {"healthy", "reason"})
    nodes = raw.get("device_nodes")
    default_node = _DEFAULT_NODES[kind].format(i=index, r=128 + index)
    model = _str(raw.get("model"), f"{where}.model")
    return Device(
        id=dev_id,
        uuid=_str(raw.get("uuid", derived_uuid(node, dev_id, kind)), f"{where}.uuid"),
        index=index,
        kind=kind,
        vendor=_str(
            raw.get("vendor", "NVIDIA" if kind is Kind.GPU else "unknown"), f"{where}.vendor"
        ),
        model=model,
        memory_bytes=memory_bytes,
        compute_units=units,
        numa_node=_int(raw.get("numa_node", -1), f"{where}.numa_node", minimum=-1),
        pci_bus_id=_str(raw.get("pci_bus_id"), f"{where}.pci_bus_id"),
        device_nodes=tuple(_str_list(nodes, f"{where}.device_nodes")) if nodes else (default_node,),
        supports=supports,
        mode=mode,
        partitions=partitions_for(
            dev_id, memory_bytes, units, mode, specs, where=f"{where}.partitioning"
        ),
        health=Health(
            _bool(health.get("healthy", True), f"{where}.health.healthy"),
            _str(health.get("reason", ""), f"{where}.health.reason", empty=True),
        ),
        # "" is allowed: a device the Runtime knows no compute capability for
        compute_capability=_str(
            raw.get("compute_capability", compute_capability_of(kind, model)),
            f"{where}.compute_capability",
            empty=True,
        ),
        binding=binding,
        # -1: derived from the index (Device.group)
        iommu_group=_int(raw["iommu_group"], f"{where}.iommu_group", minimum=0)
        if "iommu_group" in raw
        else -1,
        pcie_root=_str(
            raw.get("pcie_root", pcie_root_of(raw.get("pci_bus_id"), raw.get("numa_node", -1))),
            f"{where}.pcie_root",
            empty=True,
        ),
    )


def pcie_root_of(pci_bus_id: object, numa_node: object) -> str:
    """The simulated root complex of a device: one per NUMA node of its PCI domain, as on a
    two-socket server (``pci0000:00`` for node 0, ``pci0000:80`` for node 1); "" when the
    device has no bus id or NUMA node."""
    if not isinstance(pci_bus_id, str) or ":" not in pci_bus_id:
        return ""
    if not isinstance(numa_node, int) or isinstance(numa_node, bool) or numa_node < 0:
        return ""
    domain = pci_bus_id.split(":", 1)[0]
    return f"pci{domain}:{(numa_node * 0x80) % 0x100:02x}"


def _check_unique(devices: list[Device], source: str) -> None:
    # One device per IOMMU group: vfio-pci passes a whole group, so two devices in one could
    # not be bound one at a time.
    for attr, key in (
        ("id", "id"),
        ("uuid", "uuid"),
        ("index", "index"),
        ("pci_bus_id", "pci_bus_id"),
        ("group", "iommu_group"),
    ):
        seen: set[object] = set()
        for d in devices:
            value = getattr(d, attr)
            if value in seen:
                raise InventoryError(f"{source}: devices: {key} {value!r} is used twice")
            seen.add(value)
    part_ids = [p.id for d in devices for p in d.partitions]
    clash = set(part_ids) & {d.id for d in devices}
    if clash or len(part_ids) != len(set(part_ids)):
        raise InventoryError(f"{source}: partition ids clash: {sorted(clash) or part_ids}")


def _topology(raw: Any, ids: set[str], where: str) -> dict[tuple[str, str], Link]:
    """Pairs to links; the first group that names a pair decides it (list the fastest first)."""
    if not isinstance(raw, list):
        raise InventoryError(f"{where}: expected a list of link groups")
    out: dict[tuple[str, str], Link] = {}
    for i, group in enumerate(raw):
        g = _mapping(group, f"{where}[{i}]", {"type", "devices", "bandwidth_gbps", "lanes"})
        kind = _enum(LinkKind, g.get("type"), f"{where}[{i}].type")
        members = _str_list(g.get("devices"), f"{where}[{i}].devices")
        unknown = sorted(set(members) - ids)
        if unknown or len(members) < 2:
            raise InventoryError(
                f"{where}[{i}].devices: needs 2+ known devices, unknown: {unknown}"
            )
        bw = _number(g.get("bandwidth_gbps"), f"{where}[{i}].bandwidth_gbps")
        lanes = _int(g.get("lanes", 0), f"{where}[{i}].lanes", minimum=0)
        for a, b in combinations(members, 2):
            out.setdefault((a, b), Link(b, kind, bw, lanes))
            out.setdefault((b, a), Link(a, kind, bw, lanes))
    return out


def _with_links(device: Device, links: dict[tuple[str, str], Link]) -> Device:
    own = tuple(link for (a, _), link in sorted(links.items()) if a == device.id)
    return replace(device, links=own)


def derived_uuid(node: str, device_id: str, kind: Kind) -> str:
    """A stable uuid for a device that the file gives none."""
    prefix = "GPU" if kind is Kind.GPU else kind.value.upper()
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_URL, f'lj-runtime-sim/{node}/{device_id}')}"


def _mapping(value: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InventoryError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InventoryError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return value


def _str(value: Any, where: str, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise InventoryError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise InventoryError(f"{where}: expected a list of strings, got {value!r}")
    return [_str(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InventoryError(f"{where}: expected true or false, got {value!r}")
    return value


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InventoryError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
        raise InventoryError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _enum(cls: type[E], value: Any, where: str) -> E:
    names = [m.value for m in cls]
    if not isinstance(value, str) or value.lower() not in names:
        raise InventoryError(f"{where}: expected one of {names}, got {value!r}")
    return cls(value.lower())
