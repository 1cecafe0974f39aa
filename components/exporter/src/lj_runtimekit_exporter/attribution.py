"""Which container holds which device or share, and what it uses: pure, no I/O.

Joins the Runtime's allocation list with the kubelet's pod-resources (:func:`join`: which
container holds which device, the truth even when the Runtime recorded no pod), or, where
pod-resources does not answer, with the node's pod list. Under sharing each container gets
its own measured usage (GetAllocationUsage) or, when the Runtime does not measure it, only its
allocated share: never the whole device's value copied to every pod sharing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .snapshot import DRA_RESOURCE_PREFIX, Allocation, Held, Pod, Usage

SHARE_SEPS = ("::core-", "::mem-")
"""How the device plugin names share units: ``<device id>::core-<n>``, ``<device id>::mem-<n>``."""
GIB = 2**30


def _share(unit: str) -> tuple[str, str] | None:
    """(device id, "core" or "mem") of a share unit; None for a whole device or partition."""
    for sep in SHARE_SEPS:
        if sep in unit:
            return unit.split(sep, 1)[0], sep[2:-1]
    return None


@dataclass
class _Shares:
    """One container's shares as the kubelet counts them."""

    owner: tuple[str, str, str]
    resource: str
    devices: dict[str, None]
    core: int = 0
    mem_gib: int = 0


def _index(
    held: tuple[Held, ...],
) -> tuple[dict[str, tuple[tuple[str, str, str], str]], dict[tuple[str, str, str], _Shares]]:
    whole: dict[str, tuple[tuple[str, str, str], str]] = {}
    shares: dict[tuple[str, str, str], _Shares] = {}
    for h in held:
        if h.resource.startswith(DRA_RESOURCE_PREFIX):
            continue
        owner = (h.namespace, h.pod, h.container)
        for unit in h.device_ids:
            sh = _share(unit)
            if sh is None:
                whole.setdefault(unit, (owner, h.resource))
                continue
            entry = shares.setdefault(owner, _Shares(owner, h.resource, {}))
            entry.devices[sh[0]] = None
            if sh[1] == "core":
                entry.core += 1
            else:
                entry.mem_gib += 1
    return whole, shares


def _relabel(a: Allocation, owner: tuple[str, str, str]) -> Allocation:
    ns, pod, container = owner
    if (a.namespace, a.pod, a.container) == owner:
        return a
    return Allocation(
        a.id, ns, pod, "", container, a.resource_name, a.device_ids, a.core_percent, a.memory_bytes
    )


def join(
    allocations: tuple[Allocation, ...] | None, held: tuple[Held, ...]
) -> tuple[Allocation, ...]:
    """The Runtime's allocations, each under the container the kubelet says holds it; only those
    a live container holds (pod-resources lists the kubelet's pods, so liveness comes with it).

    Guarantees: a whole device (GPU, PPU, MIG/TDM partition) is under the container whose
    pod-resources unit is that device, whatever pod the Runtime recorded (an older device plugin
    recorded none); a share stays under its recorded container when that one holds shares, else
    goes to the one container holding shares of the same size on that device (none when several
    could: never a guess); a whole device the kubelet gave out that no allocation covers (a
    Runtime without ListAllocations, ``allocations=None``) gets one of its own, and so does a
    share then, from the kubelet's units.
    """
    whole, shares = _index(held)
    # DRA: the driver records the claim's pod and container with the Runtime when the kubelet
    # prepares it; pod-resources says that container is alive and holds a claim of the driver.
    dra = {
        (h.namespace, h.pod, h.container)
        for h in held
        if h.resource.startswith(DRA_RESOURCE_PREFIX)
    }
    out: list[Allocation] = []
    covered: set[str] = set()
    claimed: set[tuple[str, str, str]] = set()
    pending_shared: list[Allocation] = []
    for a in allocations or ():
        if (a.namespace, a.pod, a.container) in dra:
            out.append(a)
            continue
        if a.core_percent > 0 or a.memory_bytes > 0:
            if (a.namespace, a.pod, a.container) in shares:
                claimed.add((a.namespace, a.pod, a.container))
                out.append(a)
            else:
                pending_shared.append(a)
            continue
        owner = next((whole[d][0] for d in a.device_ids if d in whole), None)
        if owner is not None:
            out.append(_relabel(a, owner))
            covered.update(a.device_ids)
    for a in pending_shared:
        fits = [
            s.owner
            for s in shares.values()
            if s.owner not in claimed
            and s.core == a.core_percent
            and s.mem_gib * GIB == round(a.memory_bytes / GIB) * GIB
        ]
        near = [o for o in fits if set(a.device_ids) & set(shares[o].devices)]
        pick = near if len(near) == 1 else fits
        if len(pick) == 1:
            claimed.add(pick[0])
            out.append(_relabel(a, pick[0]))
    for unit, (owner, resource) in whole.items():
        if unit not in covered:
            ns, pod, container = owner
            out.append(Allocation(f"kubelet:{unit}", ns, pod, "", container, resource, (unit,)))
    if allocations is None:
        for s in shares.values():
            ns, pod, container = s.owner
            out.append(
                Allocation(
                    f"kubelet:{ns}/{pod}/{container}",
                    ns,
                    pod,
                    "",
                    container,
                    s.resource,
                    tuple(s.devices)[:1],
                    s.core,
                    float(s.mem_gib * GIB),
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Attribution:
    """One container's hold on one device."""

    namespace: str
    pod: str
    container: str
    device_id: str
    allocated_core_ratio: float
    """Share of the device's compute granted, 0..1 (1 for a whole device)."""
    allocated_memory_bytes: float | None
    """Memory granted on the device; None for a whole device (all of it)."""
    utilization_ratio: float | None
    """The container's own compute use, 0..1 of the whole device; None if unknown."""
    memory_used_bytes: float | None
    """The container's own device memory use; None if unknown."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.container)


def _live_pods(pods: tuple[Pod, ...]) -> tuple[set[str], set[tuple[str, str]]]:
    uids = {p.uid for p in pods if not p.terminated and p.uid}
    names = {(p.namespace, p.name) for p in pods if not p.terminated}
    return uids, names


def _is_live(a: Allocation, uids: set[str], names: set[tuple[str, str]]) -> bool:
    if a.pod_uid:
        return a.pod_uid in uids
    return (a.namespace, a.pod) in names


def attribute(
    allocations: tuple[Allocation, ...],
    usage: tuple[Usage, ...] | None,
    pods: tuple[Pod, ...] | None,
    device_utilization: dict[str, float],
    device_memory_used: dict[str, float],
) -> list[Attribution]:
    """One row per (container, device) of a live pod; rows are unique by those keys.

    Guarantees: a pod missing from ``pods`` or terminated there gets no row (``pods=None``, the
    pod source unreadable this poll, trusts the Runtime's list); a shared allocation without
    measured usage gets ``utilization_ratio=None``; a whole-device allocation alone on its device
    reports the device's own values, since the container is its only user.
    """
    by_key: dict[tuple[str, str], Usage] = {}
    for u in usage or ():
        by_key.setdefault((u.allocation_id, u.device_id), u)
    holders: dict[str, int] = {}
    for a in allocations:
        for d in set(a.device_ids):
            holders[d] = holders.get(d, 0) + 1
    uids, names = _live_pods(pods) if pods is not None else (set(), set())
    rows: dict[tuple[str, str, str, str], Attribution] = {}
    for a in allocations:
        if pods is not None and not _is_live(a, uids, names):
            continue
        shared = a.core_percent > 0 or a.memory_bytes > 0
        # a share above 100 % is passed on as it is: the exposition leaves it out and counts it
        core = a.core_percent / 100.0 if a.core_percent > 0 else 1.0
        for d in dict.fromkeys(a.device_ids):
            key = (a.namespace, a.pod, a.container, d)
            if key in rows:
                continue
            measured = by_key.get((a.id, d))
            util: float | None
            mem: float | None
            if measured is not None:
                util, mem = measured.utilization_ratio, measured.memory_used_bytes
            elif not shared and holders.get(d, 0) == 1:
                util, mem = device_utilization.get(d), device_memory_used.get(d)
            else:
                util, mem = None, None
            rows[key] = Attribution(
                namespace=a.namespace,
                pod=a.pod,
                container=a.container,
                device_id=d,
                allocated_core_ratio=core if math.isfinite(core) else 1.0,
                allocated_memory_bytes=a.memory_bytes if shared and a.memory_bytes > 0 else None,
                utilization_ratio=util,
                memory_used_bytes=mem,
            )
    return list(rows.values())
