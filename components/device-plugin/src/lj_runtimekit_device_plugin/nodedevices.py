"""The NodeDevices status and the node labels, from the devices. Pure: data in, data out.

Both are compared with what was last written, so the apiserver sees one patch per change and
none on a timer. ``observedAt`` is left out of the comparison (it changes with every write).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .model import GIB, Device, RuntimeInfo
from .resources import ResourceNames, advertise
from .topology import topology

GROUP = "lj-runtimekit.aliyun.com"
VERSION = "v1"
PLURAL = "nodedevices"
LABEL_PREFIX = "lj-runtimekit.aliyun.com/"


def _upper(s: str) -> str:
    return s.upper() if s and s not in ("unspecified", "unknown") else "OTHER"


def _partitioning(devices: Sequence[Device]) -> str:
    modes = sorted({d.partition_mode for d in devices})
    return ",".join(modes) if modes else "none"


def status(
    devices: Sequence[Device], runtime: RuntimeInfo, names: ResourceNames | None = None
) -> dict[str, Any]:
    """The ``status`` of this node's NodeDevices object (deploy/crds/), without observedAt.

    Each partition names the extended resource it is advertised under (``""`` when none), so
    the scheduler gives whole-GPU requests only the partitions the kubelet counts for them.
    """
    topo = topology(devices)
    resource_of = {
        u.id: name
        for name, units in advertise(devices, names or ResourceNames()).items()
        for u in units
    }
    kinds = sorted({d.kind for d in devices})
    models = sorted({d.model for d in devices if d.model})
    mems = sorted({d.memory_bytes // GIB for d in devices})
    out_devices = []
    for d in devices:
        switch = topo.switch.get(d.id)
        out_devices.append(
            {
                "id": d.id,
                "uuid": d.uuid,
                "index": d.index,
                "kind": _upper(d.kind) if d.kind in ("gpu", "ppu", "amd") else "OTHER",
                "vendor": d.vendor,
                "model": d.model,
                "memoryBytes": d.memory_bytes,
                "computeUnits": d.compute_units,
                "numaNode": d.numa_node,
                "pciBusId": d.pci_bus_id,
                "nvlinkIsland": topo.island.get(d.id, 0),
                "pcieSwitch": "" if switch is None else f"switch-{switch}",
                "links": [
                    {
                        "peerId": lk.peer_id,
                        "type": lk.type.upper(),
                        "bandwidthGBps": lk.bandwidth_gbps,
                    }
                    for lk in d.links
                    if lk.type in ("nvlink", "pcie_switch", "pcie_host_bridge", "system")
                ],
                "partitionMode": d.partition_mode.upper()
                if d.partition_mode in ("none", "mig", "tdm")
                else "NONE",
                "partitions": [
                    {
                        "id": p.id,
                        "profile": p.profile,
                        "memoryBytes": p.memory_bytes,
                        "computeUnits": p.compute_units,
                        "timePercent": p.time_percent,
                        "healthy": p.healthy,
                        "resource": resource_of.get(p.id, ""),
                    }
                    for p in d.partitions
                ],
                "healthy": d.healthy,
                "healthReason": d.reason,
            }
        )
    return {
        "runtimeVersion": runtime.version,
        "deviceCount": len(devices),
        "healthyCount": sum(d.healthy for d in devices),
        "summary": {
            "kind": ",".join(_upper(k) for k in kinds),
            "model": ",".join(models),
            "memoryPerDevice": ",".join(f"{m}Gi" for m in mems),
            "partitioning": _partitioning(devices),
        },
        "devices": out_devices,
    }


def _label_value(s: str) -> str:
    # label values: 63 chars of [A-Za-z0-9_.-], starting and ending alphanumeric
    v = "".join(c if c.isalnum() or c in "_.-" else "-" for c in s)[:63]
    return v.strip("_.-")


def labels(devices: Sequence[Device], runtime: RuntimeInfo) -> dict[str, str]:
    """Node labels describing the devices, for nodeSelector (the vendor doc's gpu-label)."""
    if not devices:
        return {}
    topo = topology(devices)
    islands: dict[int, int] = {}
    for d in devices:
        islands[topo.island[d.id]] = islands.get(topo.island[d.id], 0) + 1
    first = devices[0]
    out = {
        "vendor": first.vendor,
        "kind": ",".join(sorted({d.kind for d in devices})).replace(",", "_"),
        "model": first.model,
        "count": str(len(devices)),
        "memory-gib": str(min(d.memory_bytes // GIB for d in devices)),
        "partitioning": _partitioning(devices).replace(",", "_"),
        "runtime-version": runtime.version,
        "nvlink-islands": "x".join(str(n) for n in sorted(islands.values(), reverse=True)),
    }
    return {LABEL_PREFIX + k: _label_value(v) for k, v in out.items() if _label_value(v)}


def label_patch(old: dict[str, str], new: dict[str, str]) -> dict[str, str | None]:
    """The merge patch from our labels ``old`` to ``new``: None deletes; empty when equal."""
    patch: dict[str, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k.startswith(LABEL_PREFIX) and k not in new})
    return patch
