"""Moving a node between the device plugin API and DRA with GPU pods running (docs/dra.md).

The Runtime keeps every allocation across the switch; what each mode must learn is which of
them the *other* mode made. The DRA checkpoint knows the Runtime allocation ids of the claims it
prepared (:func:`.dra.checkpoint.claimed_ids`); every other allocation of our resources is a
device-plugin pod's. So:

- in mode dra, a device a device-plugin allocation still holds is published with the NoSchedule
  taint :data:`HELD_TAINT_KEY` (kube-scheduler then gives it to no new claim), and the device
  plugin's reconciler releases those allocations when their pods end; claims are not its business;
- in mode device-plugin, the units of a device a prepared claim holds are reported Unhealthy (the
  kubelet gives them to no new container), the reconciler leaves those allocations alone, and the
  kubelet's ``NodeUnprepareResources`` releases them.

Both wings and the reconciler use it (:mod:`.modes` wires it to the mode that runs). The
functions are pure; :class:`Handover` is the last answer and who waits for a change (no I/O).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .inventory import Inventory, View
from .k8s_names import is_label_value
from .model import Allocation, Device
from .resources import Unit

HELD_TAINT_KEY = "lj-runtimekit.aliyun.com/held-by-device-plugin"

Pod = tuple[str, str, str]
"""(namespace, name, uid)."""


@dataclass(frozen=True)
class Split:
    """The Runtime's allocations of our resources, by the mode that made them."""

    device_plugin: tuple[Allocation, ...] = ()
    """Not a prepared claim's: made at a device plugin ``Allocate``."""
    claims: tuple[Allocation, ...] = ()
    """Made for a claim the DRA checkpoint holds."""


def split(allocations: Iterable[Allocation], claimed: frozenset[str]) -> Split:
    """``allocations`` (ours only) as the device plugin's and the claims'."""
    mine = tuple(allocations)
    return Split(
        tuple(a for a in mine if a.id not in claimed),
        tuple(a for a in mine if a.id in claimed),
    )


def holders(allocations: Iterable[Allocation], devices: Sequence[Device]) -> dict[str, Pod]:
    """Runtime device id → the pod holding (part of) it, the first by name when several do.

    An allocation of a partition (MIG instance, TDM slice) holds its GPU; an id the inventory
    does not know is kept as it is (a device that went: nothing is published for it)."""
    parent = {d.id: d.id for d in devices}
    parent.update((p.id, d.id) for d in devices for p in d.partitions)
    out: dict[str, Pod] = {}
    for a in sorted(allocations, key=lambda a: (a.pod, a.id)):
        for i in a.device_ids:
            out.setdefault(parent.get(i, i), a.pod)
    return out


def taint_value(pod: Pod) -> str:
    """``<namespace>.<name>`` (a namespace has no dot) when it is a label value, else the uid."""
    ns, name, uid = pod
    text = f"{ns}.{name}"
    if is_label_value(text):  # never empty: it holds the dot
        return text
    return uid if is_label_value(uid) else ""


def held_taints(held: Mapping[str, Pod]) -> dict[str, tuple[dict[str, str], ...]]:
    """Runtime device id → the taint of a device a device-plugin pod holds (mode dra)."""
    out: dict[str, tuple[dict[str, str], ...]] = {}
    for device, pod in sorted(held.items()):
        taint = {"key": HELD_TAINT_KEY, "effect": "NoSchedule"}
        if value := taint_value(pod):
            taint["value"] = value
        out[device] = (taint,)
    return out


def withhold(units: Sequence[Unit], devices: Iterable[str]) -> tuple[Unit, ...]:
    """``units`` with those of ``devices`` (held by prepared claims) Unhealthy (mode
    device-plugin): the kubelet keeps counting them but gives them to no new container."""
    held = frozenset(devices)
    return tuple(
        replace(u, healthy=False) if u.device_id in held and u.healthy else u for u in units
    )


class Handover:
    """What the node's other mode still holds (device id → pod), and who waits for a change.

    ``known`` is set by the first answer: until then nobody may advertise (a device plugin that
    registered, or slices published, before it would offer a held device)."""

    def __init__(self) -> None:
        self.held: Mapping[str, Pod] = {}
        self.generation = 0
        self.known = asyncio.Event()
        self._cond = asyncio.Condition()

    async def set(self, held: Mapping[str, Pod]) -> bool:
        """Record the latest answer; True when it changed."""
        self.known.set()
        if dict(held) == dict(self.held):
            return False
        async with self._cond:
            self.held = dict(held)
            self.generation += 1
            self._cond.notify_all()
        return True

    async def changed(self, after: int) -> int:
        """The first generation newer than ``after`` (at once if there is one)."""
        async with self._cond:
            await self._cond.wait_for(lambda: self.generation > after)
        return self.generation


async def next_change(
    inventory: Inventory, view: View, handover: Handover | None, seen: int
) -> tuple[View, int]:
    """The next view of ``inventory`` or generation of ``handover``, whichever changes first."""
    if handover is None:
        return await inventory.changed(view.generation), seen
    views = asyncio.ensure_future(inventory.changed(view.generation))
    held = asyncio.ensure_future(handover.changed(seen))
    try:
        await asyncio.wait({views, held}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        views.cancel()
        held.cancel()
    return inventory.view(), handover.generation
