"""Mode device-plugin on a node whose DRA checkpoint (this boot) still holds claims: the device
plugin API, and the kubelet's DRA API for unprepare only until the last claim goes (docs/dra.md,
"Migrating a node without disturbing running pods")."""

from __future__ import annotations

import asyncio

from .. import lifecycle
from ..dra.plugin import DraHost
from ..handover import Handover
from ..node import FENCE_READ_S, Node, Parts, Reclaiming, fence_read
from . import migration
from .device_plugin import DevicePluginMode
from .mode import Registration, first


class HandBack:
    """The device plugin API with the devices prepared claims hold Unhealthy (``handover``),
    and the DRA host answering ``NodeUnprepareResources`` (and repeated prepares) until the
    checkpoint is empty; each unprepare gives the kubelet its devices back."""

    def __init__(self, parts: Parts, host: DraHost, unprepared: asyncio.Event) -> None:
        self.host = host
        self.unprepared = unprepared
        """Set after every ``NodeUnprepareResources`` (the host's ``on_unprepared``)."""
        self.handover = Handover()
        self.plugins = DevicePluginMode(after_dra=host, withheld=self.handover)
        self.reclaiming = Reclaiming(
            claimed=host.plugin.settled,
            on_listed=migration.tracker(
                self.handover, lambda: parts.inventory.view().devices, dra=False
            ),
        )

    async def start(self, node: Node, tasks: lifecycle.Tasks) -> None:
        self.plugins.withdraw_slices(node, tasks)
        tasks.spawn(
            "dra-unprepare", migration.hand_back(self.host, self.unprepared, node.reclaimer.wake)
        )
        # Registering before the first inventory would advertise nothing: wait for it (or stop).
        await first(node.follower.connected.wait(), tasks)
        # GPUs a partition layout change waits for are fenced before the kubelet hears of any
        await first(fence_read(node.inventory, FENCE_READ_S), tasks)
        if not tasks.stop.is_set():
            # the devices prepared claims hold must be known before the kubelet hears of any
            await first(self.handover.known.wait(), tasks)
        self.plugins.register(node, tasks)

    def registration(self) -> Registration:
        return self.plugins.registration()

    async def stop(self) -> None:
        await self.plugins.stop()
