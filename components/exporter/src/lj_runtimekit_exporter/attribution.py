"""Which container holds which device or share, and what it uses: pure, no I/O.

Joins the Runtime's allocation list with the node's pod list. Under sharing each container gets
its own measured usage (GetAllocationUsage) or, when the Runtime does not measure it, only its
allocated share: never the whole device's value copied to every pod sharing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .snapshot import Allocation, Pod, Usage


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
        core = min(max(a.core_percent, 0), 100) / 100.0 if a.core_percent > 0 else 1.0
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
