"""What a prepare asks of the Runtime, decided from the claim: the pure half of :mod:`.prepare`.

A result that is a share of a GPU (its ``shareID`` and ``consumedCapacity`` less than the whole,
see :func:`share_of`) becomes its own Runtime allocation of the ``gpu-core`` resource with the
consumed cores and memory, which the Runtime enforces; whole devices are allocated whole
(:func:`allocation_plan`). CDI ids are a function of claim uid, request, device and share id
(:func:`cdi_key`), so a repeated prepare answers the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..model import Device
from ..resources import ResourceNames
from .claims import Result
from .offers import CORES, CORES_WHOLE, MEMORY


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedClaimDevice:
    """One device of the answer to the kubelet."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str = ""
    """The allocation's share id, for a device that allows multiple allocations (the kubelet's
    ``Device.share_id``, which it reports through pod-resources)."""


@dataclass(frozen=True)
class Outcome:
    devices: tuple[PreparedClaimDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class RuntimeAsk:
    """One Runtime ``Allocate`` of a prepare, and which of the claim's results it serves."""

    resource: str
    device_ids: tuple[str, ...]
    results: tuple[int, ...]
    """Indexes into the claim's results (this node's) that this allocation serves."""
    core_percent: int = 0
    memory_bytes: int = 0

    @property
    def shared(self) -> bool:
        return self.core_percent > 0 or self.memory_bytes > 0


def share_of(result: Result, device: Device) -> tuple[int, int] | None:
    """(core percent, memory bytes) when ``result`` is a share of ``device``; None when it holds
    the whole device: no share id (a device that allows one allocation), or it consumed all of
    both capacities (a claim that named none, whose request policies' defaults are the whole)."""
    if not result.share_id:
        return None
    cores = min(result.consumed.get(CORES, CORES_WHOLE), CORES_WHOLE)
    memory = min(result.consumed.get(MEMORY, device.memory_bytes), device.memory_bytes)
    if cores >= CORES_WHOLE and memory >= device.memory_bytes:
        return None
    return cores, memory


@dataclass(frozen=True)
class Target:
    """What a result is allocated as: a device of the Runtime, whole (``unit`` is its id) or one
    of its partitions (``unit`` is the partition id)."""

    device: Device
    unit: str

    @property
    def whole(self) -> bool:
        return self.unit == self.device.id


def allocation_plan(
    results: Sequence[Result], by_name: Mapping[str, Device | Target], names: ResourceNames
) -> list[RuntimeAsk]:
    """The Runtime allocations that prepare ``results`` (all on devices in ``by_name``; a
    :class:`Device` there stands for itself, whole).

    Whole devices of one resource share one allocation (an NVLink pair stays one Runtime
    allocation, as the device plugin makes it). Each share is its own allocation of the
    ``gpu-core`` resource with the cores and memory it consumed: the Runtime's ``Allocate``
    carries one core/memory pair, and the Runtime then holds exactly what the scheduler counted,
    also when one claim holds two shares of one GPU.
    """
    whole: dict[str, tuple[list[str], list[int]]] = {}
    shares: list[RuntimeAsk] = []
    for i, r in enumerate(results):
        target = by_name[r.device]
        if isinstance(target, Device):
            target = Target(target, target.id)
        d = target.device
        share = share_of(r, d) if d.kind == "gpu" and target.whole else None
        if share is not None:
            cores, memory = share
            shares.append(RuntimeAsk(names.gpu_core, (d.id,), (i,), cores, memory))
            continue
        ids, served = whole.setdefault(names.ppu if d.kind == "ppu" else names.gpu, ([], []))
        if target.unit not in ids:
            ids.append(target.unit)
        served.append(i)
    return [
        RuntimeAsk(resource, tuple(ids), tuple(served)) for resource, (ids, served) in whole.items()
    ] + shares


def cdi_key(result: Result) -> str:
    """What names a result's CDI device besides claim and request: the slice device, and its
    share id when it has one, since one claim (even one request) may hold two shares of a GPU."""
    return f"{result.device}/{result.share_id}" if result.share_id else result.device
