"""The custom collector: each scrape renders fresh metric families from the latest snapshot.

No I/O happens here; the background poll replaces the snapshot, scrapes only read it. While the
Runtime is unreachable the device and container families are empty, so Prometheus marks their
series stale instead of repeating old values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import naming
from .attribution import attribute
from .naming import Metric as Spec
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
    snapshot: Snapshot | None = None
    stats: Stats = field(default_factory=Stats)


class _Family:
    """Samples of one metric family, unique by label values (first one wins)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.samples: dict[tuple[str, ...], float] = {}

    def add(self, labels: tuple[object, ...], raw: float | None) -> None:
        if raw is None:
            return
        value = naming.sample_value(self.spec, raw)
        if value is None:
            return
        key = tuple(naming.label_value(v) for v in labels)
        self.samples.setdefault(key, value)

    def build(self) -> Metric:
        family: GaugeMetricFamily | CounterMetricFamily
        labels = list(self.spec.labels)
        if self.spec.kind == "counter":
            family = CounterMetricFamily(self.spec.name, self.spec.help, labels=labels)
        else:
            family = GaugeMetricFamily(self.spec.name, self.spec.help, labels=labels)
        for key, value in self.samples.items():
            family.add_metric(list(key), value)
        return family


def _device_labels(node: str, d: Device) -> tuple[str, ...]:
    return (node, d.uuid or d.id, str(d.index), d.kind, d.model)


def _device_families(node: str, rt: RuntimeState) -> Iterator[_Family]:
    devices: dict[str, Device] = {}
    for d in rt.devices:
        devices.setdefault(d.id, d)
    fields = {name: _Family(spec) for name, spec in naming.DEVICE_FIELDS.items()}
    free, healthy, info = (
        _Family(naming.DEVICE_MEMORY_FREE),
        _Family(naming.DEVICE_HEALTHY),
        _Family(naming.DEVICE_INFO),
    )
    tx, rx = _Family(naming.LINK_TX), _Family(naming.LINK_RX)
    p_util, p_used, p_total = (
        _Family(naming.PARTITION_UTIL),
        _Family(naming.PARTITION_MEM_USED),
        _Family(naming.PARTITION_MEM_TOTAL),
    )
    for d in devices.values():
        labels = _device_labels(node, d)
        healthy.add(labels, 1.0 if d.healthy else 0.0)
        info.add((*labels, d.vendor, d.partition_mode), 1.0)
    seen: set[str] = set()
    for s in rt.samples:
        dev = devices.get(s.device_id)
        if dev is None or s.device_id in seen:
            continue
        seen.add(s.device_id)
        labels = _device_labels(node, dev)
        for name, fam in fields.items():
            fam.add(labels, getattr(s, name))
        if s.memory_total_bytes >= s.memory_used_bytes >= 0:
            free.add(labels, s.memory_total_bytes - s.memory_used_bytes)
        for link in s.links:
            tx.add((*labels, link.peer_id), link.tx_bytes_total)
            rx.add((*labels, link.peer_id), link.rx_bytes_total)
        for p in s.partitions:
            plabels = (
                *labels,
                p.partition_id,
                p.profile or dev.partition_profiles.get(p.partition_id, ""),
            )
            p_util.add(plabels, p.utilization_ratio)
            p_used.add(plabels, p.memory_used_bytes)
            p_total.add(plabels, p.memory_total_bytes)
    yield from fields.values()
    yield from (free, healthy, info, tx, rx, p_util, p_used, p_total)


def _container_families(node: str, snap: Snapshot, rt: RuntimeState) -> Iterator[_Family]:
    fams = [
        _Family(naming.CONTAINER_UTIL),
        _Family(naming.CONTAINER_MEM_USED),
        _Family(naming.CONTAINER_CORE),
        _Family(naming.CONTAINER_MEM_ALLOC),
    ]
    if rt.allocations is not None:
        devices: dict[str, Device] = {}
        for d in rt.devices:
            devices.setdefault(d.id, d)
        samples: dict[str, DeviceSample] = {}
        for s in rt.samples:
            samples.setdefault(s.device_id, s)
        rows = attribute(
            rt.allocations,
            rt.usage,
            snap.pods,
            {k: v.utilization_ratio for k, v in samples.items()},
            {k: v.memory_used_bytes for k, v in samples.items()},
        )
        util, used, core, alloc = fams
        for r in rows:
            dev = devices.get(r.device_id)
            if dev is None:
                continue
            labels = (node, dev.uuid or dev.id, str(dev.index), r.namespace, r.pod, r.container)
            util.add(labels, r.utilization_ratio)
            used.add(labels, r.memory_used_bytes)
            core.add(labels, r.allocated_core_ratio)
            alloc.add(labels, r.allocated_memory_bytes)
    yield from fams


def _self_families(state: State, now: float) -> Iterator[_Family]:
    node, snap, st = state.node, state.snapshot, state.stats
    up, info, missing = (
        _Family(naming.RUNTIME_UP),
        _Family(naming.RUNTIME_INFO),
        _Family(naming.RUNTIME_DEGRADED),
    )
    pods_up, age, ts = (
        _Family(naming.PODS_UP),
        _Family(naming.SNAPSHOT_AGE),
        _Family(naming.SNAPSHOT_TS),
    )
    if snap is not None:
        up.add((node,), 1.0 if snap.runtime is not None else 0.0)
        if snap.runtime is not None:
            info.add((node, snap.runtime.version, snap.runtime.api_version), 1.0)
        for method in sorted(snap.degraded):
            missing.add((node, method), 1.0)
        if state.pods_source != "none":
            pods_up.add((node, state.pods_source), 1.0 if snap.pods is not None else 0.0)
        age.add((node,), max(now - snap.taken_at, 0.0))
        ts.add((node,), snap.taken_at)
    coll_s, colls, errs = (
        _Family(naming.COLLECTION_SECONDS),
        _Family(naming.COLLECTIONS),
        _Family(naming.COLLECTION_ERRORS),
    )
    coll_s.add((node,), st.last_collection_seconds)
    colls.add((node,), float(st.collections))
    for source, n in st.errors.items():
        errs.add((node, source), float(n))
    scrape_s, scrapes = _Family(naming.SCRAPE_SECONDS), _Family(naming.SCRAPES)
    scrape_s.add((node,), st.last_scrape_seconds)
    scrapes.add((node,), float(st.scrapes))
    yield from (up, info, missing, pods_up, age, ts, coll_s, colls, errs, scrape_s, scrapes)


class SnapshotCollector(Collector):
    """Renders :class:`State` as metric families; register it in a fresh CollectorRegistry."""

    def __init__(self, state: State, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        state = self._state
        snap = state.snapshot
        families: list[_Family] = []
        if snap is not None and snap.runtime is not None:
            families.extend(_device_families(state.node, snap.runtime))
            families.extend(_container_families(state.node, snap, snap.runtime))
        families.extend(_self_families(state, self._clock()))
        for fam in families:
            yield fam.build()

    def describe(self) -> Iterator[Metric]:
        # Families vary with the snapshot; describing nothing keeps register() from collecting.
        return iter(())
