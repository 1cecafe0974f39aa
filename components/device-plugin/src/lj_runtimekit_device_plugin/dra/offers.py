"""What this node offers as DRA devices: the catalogue of the Runtime's inventory. Pure.

One DRA device per whole GPU or PPU bound to its vendor driver; GPUs bound to vfio-pci are not
offered (docs/dra.md). Partitions (MIG, TDM) come one of two ways (:func:`offers`):

- ``static`` (default): a partitioned GPU is offered as its partitions, as the Runtime has them
  (a layout of docs/partitioning.md), one device each, and not as a whole GPU;
- ``dynamic``: a GPU that can be partitioned is offered whole *and* as every MIG instance (or
  TDM slice) that could be made on it. They draw on one counter set per GPU (partitionable
  devices, ``sharedCounters``/``consumesCounters``): the whole GPU consumes all of it, each
  partition its compute slices and memory (MIG) or its share of time (TDM), so the scheduler
  never gives out more than the GPU holds. The partition is made when the kubelet prepares the
  claim (:mod:`.prepare`) and removed when it unprepares it. What is offered does not depend on
  which partitions exist at the moment, so making one never rewrites the slices.

Device names are DNS labels derived from the Runtime's stable device ids (:func:`device_names`);
the prepare path maps a claim's device back to the Runtime id with :func:`offers`, and
:mod:`.slices` writes the same catalogue as ResourceSlices.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..model import GIB, Device

PUBLISHED_KINDS = ("gpu", "ppu")
#: Capacity names of a shareable GPU: percent of its compute, and bytes of its memory.
CORES = "cores"
MEMORY = "memory"
CORES_WHOLE = 100
#: The smallest memory a share consumes: a share of no memory would be no limit at all.
MIN_SHARE_MEMORY = 1 << 20
STATIC, DYNAMIC = "static", "dynamic"
PARTITION_POLICIES = (STATIC, DYNAMIC)
#: MIG: a GPU has 7 compute slices and 8 memory slices; a profile of g compute slices takes this
#: many eighths of the memory (the A100/H100 shape: 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb
#: on 80 GB).
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_EIGHTHS = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
#: TDM: the slices offered on demand, percent of the GPU's time.
TDM_PERCENTS = (25, 50)
_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def dns_label(text: str, max_len: int = 63) -> str:
    """``text`` as a DNS label; a digest is added whenever the text had to change, so two ids
    that read alike after the change still get different names."""
    clean = _DNS_LABEL_BAD.sub("-", text.lower()).strip("-")
    if clean == text and 0 < len(clean) <= max_len:
        return clean
    suffix = _digest(text)
    head = clean[: max_len - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}" if head else suffix


def device_names(devices: Iterable[Device]) -> dict[str, str]:
    """Runtime device id → DRA device name (a DNS label, unique among ``devices``, stable)."""
    return {d.id: dns_label(d.id) for d in devices}


def shareable(d: Device) -> bool:
    """Whether claims may share ``d`` (the Runtime's ``gpu-core``/``gpu-memory`` allocations):
    a GPU on its driver, not partitioned (the Runtime allocates a partitioned GPU only by its
    partitions), with a memory size to share."""
    return (
        d.kind == "gpu"
        and d.binding == "driver"
        and not d.partitions
        and d.memory_bytes >= MIN_SHARE_MEMORY
    )


@dataclass(frozen=True)
class Offer:
    """One published DRA device and what it is in the Runtime."""

    name: str
    device: Device
    """The Runtime's GPU or PPU the offer is (on)."""
    kind: str
    """``whole``; ``partition`` (one the Runtime has); ``mig`` or ``tdm`` (made on demand)."""
    partition_id: str = ""
    """kind partition: the Runtime's partition id."""
    profile: str = ""
    """The MIG profile ("3g.40gb") or TDM slice name ("tdm-25")."""
    compute_slices: int = 0
    memory_bytes: int = 0
    percent: int = 0
    """TDM: the slice's share of the GPU's time."""
    counter_set: str = ""
    """The GPU's counter set when the offer draws on one (mode dynamic)."""

    @property
    def on_demand(self) -> bool:
        return self.kind in ("mig", "tdm")


def dynamic_mode(d: Device) -> str:
    """The partition mode ``d`` offers on demand: mig, else tdm, else "" (none)."""
    if d.kind != "gpu" or d.binding != "driver":
        return ""
    if "mig" in d.partition_modes and d.memory_gib >= 8:
        return "mig"
    return "tdm" if "tdm" in d.partition_modes and d.memory_bytes > 0 else ""


def _mig_offers(d: Device, whole: str, counter_set: str) -> list[Offer]:
    eighth = d.memory_gib // 8
    out = []
    for g, eighths in MIG_MEMORY_EIGHTHS.items():
        gb = eighths * eighth
        for i in range(min(MIG_COMPUTE_SLICES // g, 8 // eighths)):
            out.append(
                Offer(
                    dns_label(f"{whole}-mig-{g}g-{gb}gb-{i}"),
                    d,
                    "mig",
                    profile=f"{g}g.{gb}gb",
                    compute_slices=g,
                    memory_bytes=gb * GIB,
                    counter_set=counter_set,
                )
            )
    return out


def _tdm_offers(d: Device, whole: str, counter_set: str) -> list[Offer]:
    return [
        Offer(
            dns_label(f"{whole}-tdm-{pct}-{i}"),
            d,
            "tdm",
            profile=f"tdm-{pct}",
            memory_bytes=d.memory_bytes * pct // 100,
            percent=pct,
            counter_set=counter_set,
        )
        for pct in TDM_PERCENTS
        for i in range(100 // pct)
    ]


def offers(devices: Sequence[Device], policy: str = STATIC) -> list[Offer]:
    """The DRA devices of the node, in the Runtime's order (index, then id), each GPU's whole
    device before its partitions. The prepare path maps a claim's device name back with this.

    - ``static``: a partitioned GPU is its partitions as the Runtime has them (no whole device);
    - ``dynamic``: a GPU that supports MIG (else TDM) is its whole device and every partition
      that could be made on it, all drawing on the GPU's counter set, whatever partitions exist
      now; one that supports neither is as in ``static``.
    """
    published = sorted(
        (d for d in devices if d.kind in PUBLISHED_KINDS and d.binding == "driver"),
        key=lambda d: (d.index, d.id),
    )
    names = device_names(published)
    out: list[Offer] = []
    for d in published:
        whole = names[d.id]
        mode = dynamic_mode(d) if policy == DYNAMIC else ""
        if mode:
            counter_set = dns_label(f"{whole}-counters")
            out.append(Offer(whole, d, "whole", counter_set=counter_set))
            made = _mig_offers if mode == "mig" else _tdm_offers
            out.extend(made(d, whole, counter_set))
        elif d.partitions:
            out.extend(
                Offer(
                    dns_label(p.id),
                    d,
                    "partition",
                    partition_id=p.id,
                    profile=p.profile,
                    memory_bytes=p.memory_bytes,
                    percent=p.time_percent,
                )
                for p in d.partitions
            )
        else:
            out.append(Offer(whole, d, "whole"))
    return out
