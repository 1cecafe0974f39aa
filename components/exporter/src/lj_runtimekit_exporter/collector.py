"""The metric families of a scrape, rendered fresh from the latest snapshot.

No I/O happens here; the background poll replaces the snapshot, scrapes only read it. While the
Runtime is unreachable the device and container families are empty, so Prometheus marks their
series stale instead of repeating old values.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from . import naming
from .attribution import attribute, join
from .exposition import EOF, Family, LabelSet, render
from .snapshot import Device, DeviceSample, RuntimeState, Snapshot


@dataclass
class Stats:
    """The exporter's own counters, updated by the poller and the server."""

    collections: int = 0
    errors: dict[str, int] = field(default_factory=lambda: {"runtime": 0, "pods": 0})
    last_collection_seconds: float = 0.0
    scrapes: int = 0
    last_scrape_seconds: float = 0.0


@dataclass
class State:
    """What the poller publishes and the collector reads (one reference swap per poll)."""

    node: str
    pods_source: str
    pod_resources: bool = False
    """Whether the kubelet's pod-resources is the attribution source (the pod source is then
    the fallback, in use only while pod-resources does not answer)."""
    max_age: float = 60.0
    """A snapshot older than this (seconds) serves no device series: the poll loop is stuck."""
    snapshot: Snapshot | None = None
    stats: Stats = field(default_factory=Stats)


def _device_labels(node: str, d: Device) -> LabelSet:
    return LabelSet(naming.DEVICE_LABELS, (node, d.id, d.uuid or d.id, d.index, d.kind, d.model))


def _unique_devices(rt: RuntimeState) -> dict[str, Device]:
    devices: dict[str, Device] = {}
    for d in rt.devices:
        devices.setdefault(d.id, d)
    return devices


def _memory_total(dev: Device, sample: DeviceSample | None) -> float | None:
    """The device's memory as this poll knows it (its sample's, else the inventory's); None
    when neither says: then no memory reading of it has an upper bound."""
    for total in (sample.memory_total_bytes if sample else 0.0, dev.memory_bytes):
        if math.isfinite(total) and total > 0:
            return total
    return None


def _unique_samples(rt: RuntimeState) -> dict[str, DeviceSample]:
    samples: dict[str, DeviceSample] = {}
    for s in rt.samples:
        samples.setdefault(s.device_id, s)
    return samples


def _device_families(node: str, rt: RuntimeState) -> Iterator[Family]:
    devices = _unique_devices(rt)
    fields = {name: Family(spec) for name, spec in naming.DEVICE_FIELDS.items()}
    free, healthy, info = (
        Family(naming.DEVICE_MEMORY_FREE),
        Family(naming.DEVICE_HEALTHY),
        Family(naming.DEVICE_INFO),
    )
    tx, rx = Family(naming.LINK_TX), Family(naming.LINK_RX)
    p_util, p_used, p_total = (
        Family(naming.PARTITION_UTIL),
        Family(naming.PARTITION_MEM_USED),
        Family(naming.PARTITION_MEM_TOTAL),
    )
    label_sets = {d.id: _device_labels(node, d) for d in devices.values()}
    for d in devices.values():
        labels = label_sets[d.id]
        healthy.add(labels, 1.0 if d.healthy else 0.0)
        info.add(labels.extend(("vendor", "partition_mode"), (d.vendor, d.partition_mode)), 1.0)
    for device_id, s in _unique_samples(rt).items():
        dev = devices.get(device_id)
        if dev is None:
            continue
        labels = label_sets[device_id]
        total = _memory_total(dev, s)
        for name, fam in fields.items():
            fam.add(labels, getattr(s, name), total if name == "memory_used_bytes" else None)
        if s.memory_total_bytes >= s.memory_used_bytes >= 0:
            free.add(labels, s.memory_total_bytes - s.memory_used_bytes)
        for link in s.links:
            peer = labels.extend(("peer",), (link.peer_id,))
            tx.add(peer, link.tx_bytes_total)
            rx.add(peer, link.rx_bytes_total)
        for p in s.partitions:
            profile = p.profile or dev.partition_profiles.get(p.partition_id, "")
            plabels = labels.extend(("partition", "profile"), (p.partition_id, profile))
            p_util.add(plabels, p.utilization_ratio)
            p_total.add(plabels, p.memory_total_bytes, total)
            bounds = [b for b in (p.memory_total_bytes, total) if b is not None and b > 0]
            p_used.add(plabels, p.memory_used_bytes, min(bounds) if bounds else None)
    yield from fields.values()
    yield from (free, healthy, info, tx, rx, p_util, p_used, p_total)


def _holdable(rt: RuntimeState) -> dict[str, tuple[Device, str]]:
    """Every id an allocation may name: a device (partition "") or one of its partitions."""
    ids: dict[str, tuple[Device, str]] = {}
    for d in _unique_devices(rt).values():
        for pid in d.partition_profiles:
            ids.setdefault(pid, (d, pid))
    for d in _unique_devices(rt).values():
        ids[d.id] = (d, "")
    return ids


def _container_families(node: str, snap: Snapshot, rt: RuntimeState) -> Iterator[Family]:
    fams = [
        Family(naming.CONTAINER_UTIL),
        Family(naming.CONTAINER_MEM_USED),
        Family(naming.CONTAINER_CORE),
        Family(naming.CONTAINER_MEM_ALLOC),
    ]
    allocations, pods = rt.allocations, snap.pods
    if snap.held is not None:
        # the kubelet's word on who holds what: every allocation under its real container,
        # only those a live container holds (no pod list needed)
        allocations, pods = join(rt.allocations, snap.held), None
    if allocations is not None:
        util_of: dict[str, float] = {}
        used_of: dict[str, float] = {}
        for device_id, s in _unique_samples(rt).items():
            util_of[device_id], used_of[device_id] = s.utilization_ratio, s.memory_used_bytes
            for p in s.partitions:
                util_of.setdefault(p.partition_id, p.utilization_ratio)
                used_of.setdefault(p.partition_id, p.memory_used_bytes)
        rows = attribute(allocations, rt.usage, pods, util_of, used_of)
        holdable = _holdable(rt)
        samples = _unique_samples(rt)
        util, used, core, alloc = fams
        for r in rows:
            held = holdable.get(r.device_id)
            if held is None:
                continue
            dev, partition = held
            labels = LabelSet(
                naming.CONTAINER_LABELS,
                (node, dev.id, dev.uuid or dev.id, dev.index, partition, *r.key),
            )
            total = _memory_total(dev, samples.get(dev.id))
            util.add(labels, r.utilization_ratio)
            used.add(labels, r.memory_used_bytes, total)
            core.add(labels, r.allocated_core_ratio)
            alloc.add(labels, r.allocated_memory_bytes, total)
    yield from fams


def _self_families(state: State, now: float) -> Iterator[Family]:
    node, snap, st = state.node, state.snapshot, state.stats
    up, info, missing = (
        Family(naming.RUNTIME_UP),
        Family(naming.RUNTIME_INFO),
        Family(naming.RUNTIME_DEGRADED),
    )
    pods_up, age, ts = (
        Family(naming.PODS_UP),
        Family(naming.SNAPSHOT_AGE),
        Family(naming.SNAPSHOT_TS),
    )
    if snap is not None:
        up.add((node,), 1.0 if snap.runtime is not None else 0.0)
        if snap.runtime is not None:
            info.add((node, snap.runtime.version, snap.runtime.api_version), 1.0)
        for method in sorted(snap.degraded):
            missing.add((node, method), 1.0)
        if state.pod_resources:
            pods_up.add((node, "pod-resources"), 1.0 if snap.held is not None else 0.0)
        if state.pods_source != "none" and snap.held is None:  # the fallback, while in use
            pods_up.add((node, state.pods_source), 1.0 if snap.pods_up else 0.0)
        age.add((node,), max(now - snap.taken_at, 0.0))
        ts.add((node,), snap.taken_at)
    coll_s, colls, errs = (
        Family(naming.COLLECTION_SECONDS),
        Family(naming.COLLECTIONS),
        Family(naming.COLLECTION_ERRORS),
    )
    coll_s.add((node,), st.last_collection_seconds)
    colls.add((node,), float(st.collections))
    for source, n in st.errors.items():
        errs.add((node, source), float(n))
    scrape_s, scrapes = Family(naming.SCRAPE_SECONDS), Family(naming.SCRAPES)
    scrape_s.add((node,), st.last_scrape_seconds)
    scrapes.add((node,), float(st.scrapes))
    yield from (up, info, missing, pods_up, age, ts, coll_s, colls, errs, scrape_s, scrapes)


def snapshot_families(state: State, now: float) -> list[Family]:
    """Device and container families of the current snapshot, or none when it must not be served.

    Guarantees: they come only from a snapshot that reached the Runtime and is at most
    ``state.max_age`` seconds old; otherwise they are absent (Prometheus marks them stale) while
    the self metrics say why (``runtime_up``, the snapshot's age). Every value is within its
    metric's domain (finite; not negative unless signed; a ratio within [0, 1]; memory not above
    the device's); a reading outside it is left out and counted in ``samples_dropped``.
    """
    snap = state.snapshot
    if snap is None or snap.runtime is None or now - snap.taken_at > state.max_age:
        return []
    families = [
        *_device_families(state.node, snap.runtime),
        *_container_families(state.node, snap, snap.runtime),
    ]
    return [*families, _dropped_family(state.node, families)]


def _dropped_family(node: str, families: list[Family]) -> Family:
    """How many readings each family left out as impossible (only families that left any)."""
    dropped = Family(naming.SAMPLES_DROPPED)
    for fam in families:
        if fam.dropped:
            dropped.add((node, fam.spec.exposed), float(fam.dropped))
    return dropped


def all_families(state: State, now: float) -> list[Family]:
    """Every family a scrape at ``now`` serves: the snapshot's and the exporter's own."""
    return [*snapshot_families(state, now), *_self_families(state, now)]


class Exposition:
    """The /metrics body: the snapshot's part rendered once per snapshot and format, cached.

    A scrape re-renders only the few self metrics (age, scrape count) and reuses the rest, so
    its cost does not grow with the number of scrapes per poll.
    """

    def __init__(self, state: State, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._clock = clock
        self._cached: dict[bool, tuple[Snapshot, bytes]] = {}

    def body(self, openmetrics: bool) -> bytes:
        now = self._clock()
        state = self._state
        snap = state.snapshot
        part = b""
        fresh = snap is not None and snap.runtime is not None
        if fresh and snap is not None and now - snap.taken_at <= state.max_age:
            hit = self._cached.get(openmetrics)
            if hit is None or hit[0] is not snap:
                hit = (snap, render(snapshot_families(state, now), openmetrics))
                self._cached[openmetrics] = hit
            part = hit[1]
        tail = render(_self_families(state, now), openmetrics)
        return part + tail + (EOF if openmetrics else b"")
