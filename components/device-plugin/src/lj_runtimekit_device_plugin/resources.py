"""Devices → the units each extended resource advertises. Pure: data in, data out.

Unit IDs are derived only from the Runtime's stable device ids, so they survive restarts of the
plugin and of the Runtime:

- whole GPU / PPU: the device id (``gpu-3``); a MIG instance (strategy single) or a TDM slice:
  the partition id;
- gpu-core: ``<device id>::core-<n>``, n = 0..99 (100 per GPU);
- gpu-memory: ``<device id>::mem-<n>``, one per GiB of the device;
- gpu-vfio: the device id of a GPU bound to vfio-pci. Such a GPU is passed through whole to a VM
  and the Runtime allocates nothing on it: it is never a gpu, gpu-core or gpu-memory unit. A
  device bound to a driver this build does not know (a newer Runtime's value) is advertised
  under no resource.

A unit is healthy exactly when its device (and partition) is healthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .model import Device

CORE_UNITS_PER_GPU = 100
CORE_SEP = "::core-"
MEM_SEP = "::mem-"


@dataclass(frozen=True)
class Unit:
    """One device plugin device (what the kubelet counts)."""

    id: str
    healthy: bool
    device_id: str
    """The Runtime device the unit belongs to."""
    numa_node: int = -1


@dataclass(frozen=True)
class ResourceNames:
    """Configured extended resource names, and which kinds are on."""

    gpu: str = "aliyun.com/gpu"
    gpu_core: str = "aliyun.com/gpu-core"
    gpu_memory: str = "aliyun.com/gpu-memory"
    ppu: str = "alibabacloud.com/ppu"
    gpu_vfio: str = "aliyun.com/gpu-vfio"
    enabled: frozenset[str] = frozenset({"gpu", "gpu-core", "gpu-memory", "ppu", "gpu-vfio"})
    mig_strategy: str = "single"


def device_of(unit_id: str) -> str:
    """The Runtime device id a unit ID belongs to (the unit itself for whole devices)."""
    for sep in (CORE_SEP, MEM_SEP):
        if sep in unit_id:
            return unit_id.split(sep, 1)[0]
    return unit_id


def _profile_resource(base: str, profile: str) -> str:
    return f"{base}-mig-{profile}"


def _whole_units(d: Device, names: ResourceNames) -> dict[str, list[Unit]]:
    out: dict[str, list[Unit]] = {}
    if d.binding != "driver":
        if d.vfio and d.kind == "gpu" and "gpu-vfio" in names.enabled:
            out[names.gpu_vfio] = [Unit(d.id, d.healthy, d.id, d.numa_node)]
        return out
    if d.kind == "ppu":
        if "ppu" in names.enabled:
            out[names.ppu] = [Unit(d.id, d.healthy, d.id, d.numa_node)]
        return out
    if "gpu" not in names.enabled:
        return out
    parts = d.partitions
    if d.partition_mode == "mig" and parts and names.mig_strategy != "none":
        for p in parts:
            name = (
                names.gpu
                if names.mig_strategy == "single"
                else _profile_resource(names.gpu, p.profile)
            )
            healthy = d.healthy and p.healthy
            out.setdefault(name, []).append(Unit(p.id, healthy, d.id, d.numa_node))
    elif d.partition_mode == "tdm" and parts:
        for p in parts:
            out.setdefault(names.gpu, []).append(
                Unit(p.id, d.healthy and p.healthy, d.id, d.numa_node)
            )
    else:
        out[names.gpu] = [Unit(d.id, d.healthy, d.id, d.numa_node)]
    return out


def _shared_units(d: Device, names: ResourceNames) -> dict[str, list[Unit]]:
    # Shares are of an unpartitioned GPU only: a MIG/TDM GPU is already divided by the Runtime,
    # and a vfio-bound one belongs whole to a VM.
    if d.kind != "gpu" or d.partition_mode in ("mig", "tdm") or d.binding != "driver":
        return {}
    out: dict[str, list[Unit]] = {}
    if "gpu-core" in names.enabled:
        out[names.gpu_core] = [
            Unit(f"{d.id}{CORE_SEP}{n}", d.healthy, d.id, d.numa_node)
            for n in range(CORE_UNITS_PER_GPU)
        ]
    if "gpu-memory" in names.enabled:
        out[names.gpu_memory] = [
            Unit(f"{d.id}{MEM_SEP}{n}", d.healthy, d.id, d.numa_node) for n in range(d.memory_gib)
        ]
    return out


def advertise(devices: Iterable[Device], names: ResourceNames) -> dict[str, tuple[Unit, ...]]:
    """Per extended resource, the full list of units, ordered by device index then unit.

    Guarantees: every unit ID is unique on the node and depends only on stable device and
    partition ids; a resource that is enabled and has a device appears even when all its units
    are unhealthy (the kubelet must see them go Unhealthy, not vanish).
    """
    out: dict[str, list[Unit]] = {}
    for d in sorted(devices, key=lambda d: (d.index, d.id)):
        for part in (_whole_units(d, names), _shared_units(d, names)):
            for name, units in part.items():
                out.setdefault(name, []).extend(units)
    return {name: tuple(units) for name, units in out.items()}


def capacity(advertised: Mapping[str, tuple[Unit, ...]]) -> dict[str, int]:
    """Healthy units per resource: what the node's allocatable becomes."""
    return {name: sum(u.healthy for u in units) for name, units in advertised.items()}
