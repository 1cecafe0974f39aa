"""Mode device-plugin: one kubelet plugin per extended resource (:mod:`..deviceplugin`)."""

from __future__ import annotations

from typing import Any

import structlog

from .. import lifecycle
from ..deviceplugin.allocate import Allocator
from ..deviceplugin.annotations import not_passed
from ..deviceplugin.handshake import SharedHandshake
from ..deviceplugin.plugins import PluginHost
from ..dra.plugin import DraHost
from ..handover import Handover
from ..kube import MarkUpdate, mark_pod
from ..metrics import PluginMetrics
from ..model import Injection
from ..node import FENCE_READ_S, Node, Reclaiming, fence_read
from ..podview import PodView
from . import migration
from .mode import Registration, first

log = structlog.get_logger(__name__)


class DevicePluginMode:
    """The device plugin API on the kubelet's sockets, registered once the Runtime answered.

    ``after_dra`` is the DRA host of an earlier mode dra this boot (its checkpoint holds no
    claim): its ResourceSlices are withdrawn, and its clients closed at stop. ``withheld``: the
    devices prepared claims still hold (:class:`.hand_back.HandBack`), Unhealthy to the kubelet.
    """

    def __init__(
        self, *, after_dra: DraHost | None = None, withheld: Handover | None = None
    ) -> None:
        self.after_dra = after_dra
        self.withheld = withheld
        self.reclaiming = Reclaiming()
        self._host: PluginHost | None = None

    def withdraw_slices(self, node: Node, tasks: lifecycle.Tasks) -> None:
        """After mode dra (and with an apiserver): the node's ResourceSlices go."""
        if self.after_dra is not None and node.api is not None:
            tasks.spawn("slices", migration.withdraw_slices(migration.slice_publisher(node)))

    def register(self, node: Node, tasks: lifecycle.Tasks) -> None:
        """Serve and register every resource's plugin (again after a kubelet restart)."""
        if not tasks.stop.is_set():
            self._host = _plugin_host(node, self.withheld)
            tasks.spawn("plugins", self._host.run())

    async def start(self, node: Node, tasks: lifecycle.Tasks) -> None:
        self.withdraw_slices(node, tasks)
        # Registering before the first inventory would advertise nothing: wait for it (or stop).
        await first(node.follower.connected.wait(), tasks)
        # GPUs a partition layout change waits for are fenced before the kubelet hears of any
        await first(fence_read(node.inventory, FENCE_READ_S), tasks)
        self.register(node, tasks)

    def registration(self) -> Registration:
        if self._host is None:
            return set(), {}
        return self._host.registered, self._host.unregistered

    async def stop(self) -> None:
        if self._host is not None:
            await self._host.stop()
        if self.after_dra is not None:
            await self.after_dra.stop()
            await self.after_dra.close()


def _plugin_host(node: Node, withheld: Handover | None) -> PluginHost:
    s, metrics, reclaimer = node.settings, node.metrics, node.reclaimer
    allocator = Allocator(
        node.client,
        node.names,
        s.allocate_timeout,
        _handshake(node),
        release_stale=reclaimer.release_stale,
        check=annotation_check(s.annotation_patterns, metrics),
        pods=node.pods,
        node=s.node_name,
        room=reclaimer,
        devices=node.devices,
    )

    def registered(resource: str) -> None:
        metrics.registered(resource)
        reclaimer.wake()

    def refused(resource: str) -> None:
        metrics.registration_failures.labels(resource).inc()

    host = PluginHost(
        s.plugin_dir,
        node.inventory,
        node.names,
        allocator,
        observe=metrics.observe,
        on_registered=registered,
        on_refused=refused,
        intent=allocator.intent,
        withheld=withheld,
    )
    metrics.follow_registrations(host.registration_state)
    return host


def _handshake(node: Node) -> Any:
    api, pods, s = node.api, node.pods, node.settings

    async def mark(pod: PodView, update: MarkUpdate) -> None:
        await mark_pod(api, pod.namespace, pod.name, pod.uid, update)

    if api is None or pods is None:
        return None
    return SharedHandshake(
        node.client,
        node.names,
        s.node_name,
        pods,
        mark,
        events=node.events,
        room=node.reclaimer,
        devices=node.devices,
    )


def annotation_check(patterns: tuple[str, ...], metrics: PluginMetrics) -> Any:
    told: set[str] = set()

    def check(resource: str, injection: Injection) -> None:
        bad = not_passed([k for k, _ in injection.annotations], patterns)
        if not bad:
            return
        metrics.annotation_rejected.labels(resource).inc(len(bad))
        new = [k for k in bad if k not in told]
        if new:
            told.update(new)
            log.warning(
                "injection_annotation_not_passed",
                resource=resource,
                keys=new,
                patterns=list(patterns),
                effect="containerd drops these annotations: the lj-runtime handler never sees them",
                fix="the Runtime must use keys the handler's container_annotations pass "
                "(path.Match: * does not cross /), or widen the patterns",
            )

    return check
