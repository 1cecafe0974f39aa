"""The node's last known devices and who waits for a change. No I/O.

The Runtime feeds it (snapshot, health and partition events, periodic lists); plugins and
publishers wait on :meth:`Inventory.changed` and read a consistent, immutable view. While the
Runtime is away the last known devices stay, as the kubelet must not see them vanish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from .domains import MAX_DEVICES, ids_of, screen
from .fence import overlay
from .model import Device, RuntimeInfo


@dataclass(frozen=True)
class View:
    generation: int
    devices: tuple[Device, ...]
    runtime: RuntimeInfo


class Inventory:
    """Devices by id; every real change bumps the generation and wakes waiters."""

    def __init__(self) -> None:
        self._devices: dict[str, Device] = {}
        self._runtime = RuntimeInfo()
        self._generation = 0
        self._cond = asyncio.Condition()
        self._fenced: dict[str, str] = {}
        self.fence_known = asyncio.Event()
        """Set once the node's fence was first read (or there is no apiserver to read it from)."""

    def view(self) -> View:
        """The devices, fenced ones unhealthy (:func:`.fence.overlay`)."""
        devs = sorted(self._devices.values(), key=lambda d: (d.index, d.id))
        return View(self._generation, overlay(devs, self._fenced), self._runtime)

    async def set_fence(self, fenced: dict[str, str]) -> bool:
        """Record the node's fence (device id → why); True when it changed the view."""
        self.fence_known.set()
        if fenced == self._fenced:
            return False
        self._fenced = dict(fenced)
        await self._bump()
        return True

    async def _bump(self) -> None:
        async with self._cond:
            self._generation += 1
            self._cond.notify_all()

    async def replace(self, devices: Iterable[Device]) -> list[tuple[Device | None, Device]]:
        """Set the full inventory; returns (old, new) of each device that changed."""
        new = {d.id: d for d in devices}
        changed = [(self._devices.get(i), d) for i, d in new.items() if self._devices.get(i) != d]
        removed = set(self._devices) - set(new)
        if changed or removed:
            self._devices = new
            await self._bump()
        return changed

    async def update(self, devices: Iterable[Device]) -> list[tuple[Device | None, Device]]:
        """Merge some devices (an event); returns (old, new) of each one that changed.

        A device whose id or partition ids another device already holds, or one past
        :data:`MAX_DEVICES`, is left out (logged): unit ids stay unique and bounded."""
        devices = list(devices)
        mine = {d.id for d in devices}
        others = [o for i, o in self._devices.items() if i not in mine]
        devices = screen(
            devices,
            taken=[i for o in others for i in ids_of(o)],
            limit=max(MAX_DEVICES - len(others), 0),
        )
        changed = [(self._devices.get(d.id), d) for d in devices if self._devices.get(d.id) != d]
        if changed:
            for _, d in changed:
                self._devices[d.id] = d
            await self._bump()
        return changed

    async def remove(self, ids: Iterable[str]) -> None:
        gone = [i for i in ids if i in self._devices]
        for i in gone:
            del self._devices[i]
        if gone:
            await self._bump()

    async def set_runtime(self, info: RuntimeInfo) -> None:
        if info != self._runtime:
            self._runtime = info
            await self._bump()

    async def changed(self, after: int) -> View:
        """The first view newer than generation ``after`` (at once if there is one)."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._generation > after)
        return self.view()
