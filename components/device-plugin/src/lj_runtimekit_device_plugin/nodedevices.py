"""The NodeDevices status and the node labels, from the devices. Pure: data in, data out.

Both are compared with what was last written, so the apiserver sees one patch per change and
none on a timer. ``observedAt`` is left out of the comparison (it changes with every write).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .k8s_names import is_label_value
from .model import GIB, Device, RuntimeInfo
from .resources import ResourceNames, advertise
from .topology import topology

GROUP = "lj-runtimekit.aliyun.com"
VERSION = "v1"
PLURAL = "nodedevices"
#: The default prefix of the node labels (settings ``node_label_prefix`` renames it).
DEFAULT_LABEL_PREFIX = "lj-runtimekit.aliyun.com"
LABEL_PREFIX = DEFAULT_LABEL_PREFIX + "/"
#: Node label naming the prefix the plugin labels the node under, so that a plugin started with
#: another prefix finds (and removes) the labels of the old one. Its key is fixed (it must be
#: found whatever the prefix was), and a label, not an annotation: the plugin's admission policy
#: (deploy/deviceplugin/02-rbac.yaml) lets it change only labels under the default prefix.
PREFIX_LABEL = DEFAULT_LABEL_PREFIX + "/node-label-prefix"
_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)")


class LabelFacts(Protocol):
    """What the Runtime says beside the devices (``runtime.DriverFacts``)."""

    @property
    def driver_version(self) -> str: ...

    @property
    def compute_capability(self) -> Mapping[str, str]: ...

    @property
    def partition_modes(self) -> Mapping[str, frozenset[str]]: ...


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
                "fenced": d.fenced,
                "binding": d.binding.upper() if d.binding in ("driver", "vfio") else "OTHER",
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
    # label values: 63 chars of [A-Za-z0-9_.-], starting and ending alphanumeric. ASCII only:
    # str.isalnum() also passes "é" or "¹", and the apiserver then refuses the whole patch.
    v = "".join(c if (c.isascii() and c.isalnum()) or c in "_.-" else "-" for c in s)
    return v.strip("_.-")[:63].strip("_.-")


def labels(
    devices: Sequence[Device],
    runtime: RuntimeInfo,
    facts: LabelFacts | None = None,
    *,
    names: ResourceNames | None = None,
    prefix: str = DEFAULT_LABEL_PREFIX,
) -> dict[str, str]:
    """Node labels describing the devices, for nodeSelector (the vendor doc's gpu-label, GPU
    Feature Discovery's set); docs/node-labels.md lists them.

    Guarantees: every key is ``<prefix>/<name>`` with a valid name part, every value a valid
    label value; a fact the Runtime did not give (an older Runtime, ``facts`` None) is left out,
    never guessed.
    """
    if not devices:
        return {}
    names = names or ResourceNames()
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
        "sharing-mode": _sharing_mode(devices, names),
        # GPUs bound to vfio-pci for pass-through ("0" also from a Runtime older than bindings:
        # all its devices are on the vendor's driver)
        "vfio.count": str(sum(d.vfio for d in devices)),
        **_profile_counts(devices),
    }
    if facts is not None:
        out.update(_driver_labels(devices, facts, names))
    return {
        f"{prefix}/{k}": _label_value(v)
        for k, v in out.items()
        # the key's name part, after the (checked) prefix: a qualified name's, non-empty
        if k and is_label_value(k) and _label_value(v)
    }


def _sharing_mode(devices: Sequence[Device], names: ResourceNames) -> str:
    """Which shares of a GPU this node advertises: core, memory, core-memory or none."""
    offered = {n for n, units in advertise(devices, names).items() if units}
    kinds = [k for k, n in (("core", names.gpu_core), ("memory", names.gpu_memory)) if n in offered]
    return "-".join(kinds) or "none"


def _profile_counts(devices: Sequence[Device]) -> dict[str, str]:
    """``mig-<profile>.count`` per MIG profile and ``<tdm slice>.count`` per TDM slice size."""
    counts: Counter[str] = Counter()
    for d in devices:
        for p in d.partitions:
            if d.partition_mode == "mig":
                counts[f"mig-{p.profile}.count"] += 1
            elif d.partition_mode == "tdm":
                counts[f"{p.profile}.count"] += 1
    return {k: str(n) for k, n in sorted(counts.items())}


def _driver_labels(
    devices: Sequence[Device], facts: LabelFacts, names: ResourceNames
) -> dict[str, str]:
    out: dict[str, str] = {}
    if facts.driver_version:
        out["driver-version"] = facts.driver_version
        if m := _MAJOR_MINOR.match(facts.driver_version):
            out["driver-version.major"], out["driver-version.minor"] = m[1], m[2]
    # A selector on compute capability promises it on every device: the lowest, and only when
    # every device reports one (GPU Feature Discovery's gpu.compute.major/minor).
    caps = [_MAJOR_MINOR.match(facts.compute_capability.get(d.id, "")) for d in devices]
    if all(caps):
        major, minor = min((int(m[1]), int(m[2])) for m in caps if m)
        out["compute.major"], out["compute.minor"] = str(major), str(minor)
    modes = {m for d in devices for m in facts.partition_modes.get(d.id, frozenset())}
    modes |= {d.partition_mode for d in devices if d.partition_mode in ("mig", "tdm")}
    for mode in sorted(modes):
        out[f"{mode}.capable"] = "true"
    if "mig" in modes:
        out["mig.strategy"] = names.mig_strategy
    return out


def owned_prefixes(current: str, recorded: str | None) -> tuple[str, ...]:
    """The prefixes whose labels the plugin removes when it no longer writes them: the current
    one and the one it last wrote under (the :data:`PREFIX_LABEL` it finds on the node; a node
    labelled before the prefix was recorded carries the default's)."""
    previous = recorded or DEFAULT_LABEL_PREFIX
    return (current,) if previous == current else (current, previous)


def label_patch(
    old: Mapping[str, str],
    new: Mapping[str, str],
    prefixes: Iterable[str] = (DEFAULT_LABEL_PREFIX,),
) -> dict[str, str | None]:
    """The merge patch from our labels ``old`` to ``new``: None deletes; empty when equal.

    Only labels under ``prefixes`` (ours) are deleted; everything else on the node is kept.
    """
    owned = tuple(p.rstrip("/") + "/" for p in prefixes)
    patch: dict[str, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k.startswith(owned) and k not in new})
    return patch
