"""Which of the Runtime's device facts can be believed. Pure: data in, data out (and a log).

The Runtime is vendor code outside this process; what it reports becomes unit ids the kubelet
counts. A fact that would repeat a unit id, forge one (``::``), or advertise an absurd number of
units is left out here, with a log naming the device, before it reaches the inventory.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from .model import Device

log = structlog.get_logger(__name__)

#: More memory than any accelerator has (16 TiB): a Runtime claiming it is misreporting, and
#: believing it would advertise one gpu-memory unit per GiB (2^34 units for 2^64-1 bytes).
MAX_DEVICE_MEMORY_BYTES = 16 << 40
#: More devices than any node holds: the rest of a longer list is left out (bounded memory: each
#: GPU advertises 100 gpu-core units and one gpu-memory unit per GiB).
MAX_DEVICES = 256
#: Unit ids are ``<device id>::core-<n>``/``::mem-<n>``: an id with ``::`` could forge another's.
RESERVED_ID_PART = "::"


def screen(
    devices: Iterable[Device], *, taken: Iterable[str] = (), limit: int = MAX_DEVICES
) -> list[Device]:
    """The devices whose facts can be believed; each one left out is logged with why.

    Guarantees: every device and partition id is non-empty, free of ``::`` and unique among all
    of them (unit ids, hence what the kubelet counts, stay unique); no device claims more than
    :data:`MAX_DEVICE_MEMORY_BYTES`; at most ``limit`` devices. ``taken``: ids that other
    devices already hold (the rest of the inventory, when an event adds some).
    """
    devices = list(devices)
    seen: dict[str, int] = dict.fromkeys(taken, 1)
    for d in devices:
        for i in ids_of(d):
            seen[i] = seen.get(i, 0) + 1
    kept = []
    for d in devices:
        ids = ids_of(d)
        why = ""
        if any(not i or RESERVED_ID_PART in i for i in ids):
            why = f"empty id or one containing {RESERVED_ID_PART!r}"
        elif any(seen[i] > 1 for i in ids):
            why = "its id or a partition id is repeated"
        elif any(m > MAX_DEVICE_MEMORY_BYTES for m in (d.memory_bytes, *memory_of(d))):
            why = f"memory_bytes {d.memory_bytes} is beyond any real device"
        if why:
            log.error(
                "runtime_device_rejected",
                device=d.id,
                partitions=[p.id for p in d.partitions],
                why=why,
                effect="the device is not advertised until the Runtime reports it sanely",
            )
            continue
        kept.append(d)
    if len(kept) > limit:
        kept.sort(key=lambda d: (d.index, d.id))
        log.error(
            "runtime_devices_truncated",
            reported=len(kept),
            kept=limit,
            left_out=[d.id for d in kept[limit:]][:20],
            effect="only the first devices by index are advertised",
        )
        kept = kept[:limit]
    return kept


def memory_of(d: Device) -> tuple[int, ...]:
    return tuple(p.memory_bytes for p in d.partitions)


def ids_of(d: Device) -> tuple[str, ...]:
    """The device's id and its partitions' ids: each becomes a unit id."""
    return (d.id, *(p.id for p in d.partitions))
