"""Which of the Runtime's numbers can be true, and what happens to one that cannot. Pure: data
in, data out (and logs).

The Runtime is vendor code outside this process, and what it reports becomes what the kubelet
counts (ListAndWatch), what the scheduler reads (NodeDevices, ResourceSlices) and what a share is
checked against (:mod:`.deviceplugin.headroom`). A value outside its domain is never clamped into
it (a clamped number looks true and is not): it is left out, logged when that changes, and
counted in ``lj_device_plugin_runtime_values_dropped{field}``.

What is left out is the smallest thing the value makes unbelievable:

=========================  ===========================================  ======================
field                      domain                                       outside it
=========================  ===========================================  ======================
``id``                     device and partition ids non-empty, without  the device
                           ``::``, unique among all of them
``memory_bytes``           0 to 16 TiB (0: the Runtime does not say)    the device
``partition.memory_bytes`` each and their sum at most the device's      the device
                           memory (when it says one)
``partition.time_percent`` each and their sum 0 to 100                  the device
``partition.compute_units`` at most the device's (when it says one)     the device
``devices``                at most 256 devices                          those past it (by
                                                                        index)
``numa_node``              -1 (unknown) or 0 to 1023 (Linux's most)     the value: -1
``compute_units``          0 to 2^20 (0: unknown)                       the value: 0
``link.bandwidth_gbps``    finite, 0 to 10^5 (0: unknown)               the value: 0
``allocation.*``           ``core_percent`` 0 to 100, ``memory_bytes``  no share on its
                           0 to 16 TiB, at least one device id          devices (headroom)
=========================  ===========================================  ======================

A withheld value reads as what the interface's default already means (unknown), so nothing
downstream mistakes it for a fact; a withheld device is not advertised until the Runtime reports
it sanely. An allocation is the Runtime's record of what it holds, so it is never dropped (the
reconciler may still release it): :func:`allocation_error` makes its devices take no share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import structlog

from .model import Allocation, Device, Link, Partition

log = structlog.get_logger(__name__)

#: More memory than any accelerator has (16 TiB): a Runtime claiming it is misreporting, and
#: believing it would advertise one gpu-memory unit per GiB (2^34 units for 2^64-1 bytes).
MAX_DEVICE_MEMORY_BYTES = 16 << 40
#: More devices than any node holds: the rest of a longer list is left out (bounded memory: each
#: GPU advertises 100 gpu-core units and one gpu-memory unit per GiB).
MAX_DEVICES = 256
#: Unit ids are ``<device id>::core-<n>``/``::mem-<n>``: an id with ``::`` could forge another's.
RESERVED_ID_PART = "::"
MAX_PERCENT = 100
#: Linux numbers NUMA nodes below MAX_NUMNODES, at most 1 << 10: a higher one would reach the
#: kubelet's topology manager as a node that does not exist.
MAX_NUMA_NODE = 1023
#: Far above any accelerator's cores, SMs or CUs (tens of thousands).
MAX_COMPUTE_UNITS = 1 << 20
#: Far above any interconnect (GB/s or Gb/s alike).
MAX_LINK_GBPS = 1e5


@dataclass(frozen=True)
class Dropped:
    """One value outside its domain."""

    subject: str
    """The device (or allocation) id it belongs to."""
    field: str
    """Its field, as the metric's label names it (``partition.time_percent``)."""
    value: str
    withheld: str
    """What is left out for it: ``device``, ``value`` or ``share``."""


def _shown(value: object) -> str:
    return repr(value)[:40]


def _values(d: Device) -> tuple[Device, list[Dropped]]:
    """``d`` with each descriptive value outside its domain withheld (read as unknown)."""
    out: list[Dropped] = []

    def drop(field: str, value: object) -> None:
        out.append(Dropped(d.id, field, _shown(value), "value"))

    numa, units = d.numa_node, d.compute_units
    if not -1 <= numa <= MAX_NUMA_NODE:
        drop("numa_node", numa)
        numa = -1
    if not 0 <= units <= MAX_COMPUTE_UNITS:
        drop("compute_units", units)
        units = 0
    links = []
    for lk in d.links:
        bw = lk.bandwidth_gbps
        if math.isfinite(bw) and 0 <= bw <= MAX_LINK_GBPS:
            links.append(lk)
        else:
            drop("link.bandwidth_gbps", bw)
            links.append(Link(lk.peer_id, lk.type, 0.0))
    parts = []
    for p in d.partitions:
        if 0 <= p.compute_units <= MAX_COMPUTE_UNITS:
            parts.append(p)
        else:
            drop("partition.compute_units", p.compute_units)
            parts.append(replace(p, compute_units=0))
    if not out:
        return d, out
    return replace(
        d, numa_node=numa, compute_units=units, links=tuple(links), partitions=tuple(parts)
    ), out


def _memory_ok(m: object) -> bool:
    return type(m) is int and 0 <= m <= MAX_DEVICE_MEMORY_BYTES


def _impossible(d: Device, repeated: Callable[[str], bool]) -> tuple[str, object] | None:
    """(field, value) of the first fact that makes the whole device unbelievable, or None."""
    ids = ids_of(d)
    bad_id = next((i for i in ids if not i or RESERVED_ID_PART in i or repeated(i)), None)
    if bad_id is not None:
        return "id", bad_id
    if not _memory_ok(d.memory_bytes):
        return "memory_bytes", d.memory_bytes
    parts: Sequence[Partition] = d.partitions
    for p in parts:
        if not _memory_ok(p.memory_bytes) or (d.memory_bytes and p.memory_bytes > d.memory_bytes):
            return "partition.memory_bytes", p.memory_bytes
        if not 0 <= p.time_percent <= MAX_PERCENT:
            return "partition.time_percent", p.time_percent
        if d.compute_units and p.compute_units > d.compute_units:
            return "partition.compute_units", p.compute_units
    memory = sum(p.memory_bytes for p in parts)
    if d.memory_bytes and memory > d.memory_bytes:
        return "partition.memory_bytes", f"sum {memory} > {d.memory_bytes}"
    percent = sum(p.time_percent for p in parts)
    if percent > MAX_PERCENT:
        return "partition.time_percent", f"sum {percent}"
    return None


def screen_devices(
    devices: Iterable[Device], *, taken: Iterable[str] = (), limit: int = MAX_DEVICES
) -> tuple[list[Device], list[Dropped]]:
    """(the devices that can be believed, every value left out).

    Guarantees of each device kept: every value in the domain of the module's table; its and
    its partitions' ids non-empty, free of ``::`` and unique among all of them and ``taken``
    (ids other devices already hold: the rest of the inventory, when an event adds some), so
    unit ids, hence what the kubelet counts, stay unique; at most ``limit`` devices.
    """
    devices = list(devices)
    seen: dict[str, int] = dict.fromkeys(taken, 1)
    for d in devices:
        for i in ids_of(d):
            seen[i] = seen.get(i, 0) + 1
    kept: list[Device] = []
    dropped: list[Dropped] = []
    for reported in devices:
        d, withheld = _values(reported)
        dropped += withheld
        why = _impossible(d, lambda i: seen[i] > 1)
        if why is None:
            kept.append(d)
        else:
            dropped.append(Dropped(d.id, why[0], _shown(why[1]), "device"))
    if len(kept) > limit:
        kept.sort(key=lambda d: (d.index, d.id))
        dropped += [Dropped(d.id, "devices", f"past {limit}", "device") for d in kept[limit:]]
        kept = kept[:limit]
    return kept, dropped


def allocation_error(a: Allocation, device: Device | None = None) -> str | None:
    """Why allocation ``a`` cannot be what the Runtime holds, or None. With ``device``, also
    memory above that device's."""
    if not a.device_ids:
        return f"allocation {a.id} holds no device"
    if not 0 <= a.core_percent <= MAX_PERCENT:
        return f"allocation {a.id} holds {a.core_percent} % of a GPU"
    if not _memory_ok(a.memory_bytes):
        return f"allocation {a.id} holds {a.memory_bytes} bytes"
    if device is not None and device.memory_bytes and a.memory_bytes > device.memory_bytes:
        return (
            f"allocation {a.id} holds {a.memory_bytes} bytes of {device.id}, which has "
            f"{device.memory_bytes}"
        )
    return None


def allocation_drops(a: Allocation) -> list[Dropped]:
    """The values of ``a`` outside their domain (its devices then take no share)."""
    out = []
    if not a.device_ids:
        out.append(Dropped(a.id, "allocation.device_ids", "[]", "share"))
    if not 0 <= a.core_percent <= MAX_PERCENT:
        out.append(Dropped(a.id, "allocation.core_percent", _shown(a.core_percent), "share"))
    if not _memory_ok(a.memory_bytes):
        out.append(Dropped(a.id, "allocation.memory_bytes", _shown(a.memory_bytes), "share"))
    return out


def screen(
    devices: Iterable[Device], *, taken: Iterable[str] = (), limit: int = MAX_DEVICES
) -> list[Device]:
    """:func:`screen_devices`, each value left out logged (for callers without a
    :class:`Screening`: an event merged into the inventory)."""
    kept, dropped = screen_devices(devices, taken=taken, limit=limit)
    for d in dropped:
        _log_dropped(d.subject, [d])
    return kept


def _log_dropped(subject: str, dropped: Sequence[Dropped]) -> None:
    log.error(
        "runtime_values_dropped",
        subject=subject,
        dropped=[{"field": d.field, "value": d.value, "withheld": d.withheld} for d in dropped],
        effect="a withheld device is not advertised, a withheld value reads as unknown, a "
        "withheld share is not given, until the Runtime reports it sanely",
        check="the Runtime's device inventory (its version, its driver)",
    )


class Screening:
    """The screen of one Runtime client's replies: every value left out is counted (``count``,
    told the field), and logged only when what is left out of a device or an allocation
    changes, so a Runtime that keeps misreporting does not fill the log at every poll."""

    def __init__(self, count: Callable[[str], None] | None = None) -> None:
        self.count = count or (lambda _: None)
        self._devices: dict[str, frozenset[Dropped]] = {}
        self._allocations: dict[str, frozenset[Dropped]] = {}

    def devices(self, devices: Iterable[Device], *, complete: bool = True) -> list[Device]:
        """The devices of one reply that can be believed; ``complete``: the reply lists every
        device (a snapshot), so what was told of a device it does not list is forgotten."""
        devices = list(devices)
        kept, dropped = screen_devices(devices)
        self._tell(self._devices, {d.id for d in devices}, dropped, complete)
        return kept

    def allocations(self, allocations: Sequence[Allocation], *, complete: bool) -> None:
        """Count and log the values of ``allocations`` outside their domain (they are kept)."""
        dropped = [x for a in allocations for x in allocation_drops(a)]
        self._tell(self._allocations, {a.id for a in allocations}, dropped, complete)

    def _tell(
        self,
        told: dict[str, frozenset[Dropped]],
        subjects: set[str],
        dropped: Sequence[Dropped],
        complete: bool,
    ) -> None:
        by: dict[str, set[Dropped]] = {}
        for d in dropped:
            self.count(d.field)
            by.setdefault(d.subject, set()).add(d)
        for subject in sorted(subjects):
            now = frozenset(by.get(subject, ()))
            if now == told.get(subject, frozenset()):
                continue
            if now:
                _log_dropped(subject, sorted(now, key=lambda d: (d.field, d.value)))
                told[subject] = now
            else:
                log.info("runtime_values_sane", subject=subject)
                del told[subject]
        if complete:
            for gone in [s for s in told if s not in subjects]:
                del told[gone]


def memory_of(d: Device) -> tuple[int, ...]:
    return tuple(p.memory_bytes for p in d.partitions)


def ids_of(d: Device) -> tuple[str, ...]:
    """The device's id and its partitions' ids: each becomes a unit id."""
    return (d.id, *(p.id for p in d.partitions))
