"""Mode dra: the kubelet's DRA plugin, the node's ResourceSlices and NRI (:mod:`..dra`)."""

from __future__ import annotations

from pathlib import Path

from .. import lifecycle
from ..dra.nri import NriPlugin
from ..dra.plugin import DraHost
from ..handover import Handover
from ..inventory import View
from ..node import Node, Parts, Reclaiming, publish
from . import migration
from .mode import Registration, first


class DraMode:
    """The ResourceSlices (what device-plugin pods still hold tainted in them, ``handover``), the
    NRI plugin with --nri, and the DRA kubelet plugin once the Runtime answered."""

    def __init__(self, parts: Parts, host: DraHost) -> None:
        self.host = host
        self.handover = Handover()
        self.reclaiming = Reclaiming(
            claimed=host.plugin.settled,
            on_listed=migration.tracker(
                self.handover, lambda: parts.inventory.view().devices, dra=True
            ),
            listed_pods_hold=True,
        )

    async def start(self, node: Node, tasks: lifecycle.Tasks) -> None:
        slices = migration.slice_publisher(node, self.handover)

        async def changes(view: View, seen: int) -> tuple[View, int]:
            return await slices.next_change(node.inventory, view, self.handover, seen)

        tasks.spawn("slices", publish(node.inventory, slices, node.client, self.handover, changes))
        tasks.spawn("slices-watch", slices.watch())
        if (nri := nri_plugin(node)) is not None:
            tasks.spawn("nri", nri.run())
        # Registering before the first inventory would advertise nothing: wait for it (or stop).
        await first(node.follower.connected.wait(), tasks)
        if not tasks.stop.is_set():
            await self.host.start()

    def registration(self) -> Registration:
        reg, driver = self.host.registration, self.host.driver
        registered = {driver} if reg.registered.is_set() else set()
        return registered, {driver: reg.refusal} if reg.refusal else {}

    async def stop(self) -> None:
        await self.host.stop()
        await self.host.close()


def nri_plugin(node: Node) -> NriPlugin | None:
    """The NRI plugin that puts the injection annotations of prepared claims on containers
    (with --nri); None otherwise."""
    s = node.settings
    return NriPlugin(s.nri_socket, Path(s.cdi_dir), s.cdi_kind) if s.nri else None
