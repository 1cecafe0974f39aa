"""The node core every mode runs on (docs/dra.md): the Runtime client, the inventory and its
health, the reclaimer, NodeDevices and the node labels, the numbers of ``/metrics``.

:func:`connect` makes the clients, :func:`build` the reconciler and the health follower once the
mode is chosen (a mode that serves DRA takes part in every reconcile pass: :class:`Reclaiming`),
:meth:`Node.spawn` starts the core's tasks and :meth:`Node.close` closes its clients. The publish
loop (:func:`publish`) writes NodeDevices here and the ResourceSlices in mode dra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from kubernetes_asyncio.config import ConfigException

from . import fence, lifecycle
from .handover import Handover, next_change
from .health import HealthFollower
from .informer import Informer
from .inventory import Inventory, View
from .kube import (
    ApiserverUnavailable,
    Publisher,
    WatchExpired,
    api_client,
    list_node,
    node_pods,
    post_event,
    watch_node,
)
from .kubelet import PodResourcesClient, PodsUnavailable, kubelet_pods
from .metrics import PluginMetrics
from .model import Device, RuntimeInfo
from .pod_events import PodEvents
from .pods_source import FallbackPods, PodLister
from .podview import PodView, pod_state, pod_view
from .reclaim import Claimed, Listed, Reclaimer
from .reconcile import PodState
from .resources import ResourceNames
from .runtime import DriverFacts, RuntimeClient, RuntimeUnavailable, driver_facts
from .settings import Settings

log = structlog.get_logger(__name__)

#: Seconds registration waits for the node's fence (:func:`fence_read`).
FENCE_READ_S = 10.0

Changes = Callable[[View, int], Awaitable[tuple[View, int]]]
"""(the view and handover generation last published) → the next ones to publish."""


class Writer(Protocol):
    """What the publish loop writes to: NodeDevices and labels, or the ResourceSlices."""

    async def publish(
        self, devices: list[Device], runtime: RuntimeInfo, facts: DriverFacts | None
    ) -> bool: ...


@dataclass(frozen=True)
class Reclaiming:
    """A mode's part in every reconcile pass (:class:`.reclaim.Reclaimer`): nothing in plain
    device-plugin mode; with DRA, the prepared claims and what the other mode holds."""

    claimed: Claimed | None = None
    on_listed: Listed | None = None
    listed_pods_hold: bool = False


@dataclass(frozen=True)
class Parts:
    """The clients, made before the mode is chosen (the DRA host needs them)."""

    settings: Settings
    names: ResourceNames
    metrics: PluginMetrics
    inventory: Inventory
    client: RuntimeClient
    api: Any
    """The apiserver client; None when none is configured."""
    pods: PodLister | None
    """The pods on this node from the configured source; None when it cannot be reached."""
    events: PodEvents
    """Warning Events on pods (refusals at Allocate and Prepare), one rate limit for all."""


@dataclass(frozen=True)
class Node(Parts):
    """The parts, with the reconciler and the health follower."""

    reclaimer: Reclaimer
    follower: HealthFollower

    def devices(self) -> Sequence[Device]:
        return self.inventory.view().devices

    def spawn(self, tasks: lifecycle.Tasks) -> None:
        """The core's tasks: Runtime health, metrics, reconcile passes, NodeDevices and labels."""
        for name, job in (
            ("watch", self.follower.watch()),
            ("poll", self.follower.poll()),
            ("metrics", _track(self.inventory, self.metrics, self.follower)),
        ):
            tasks.spawn(name, job)
        # the device plugin API's allocations only (also in mode dra: those of pods from before
        # the switch); a prepared claim's the kubelet releases through NodeUnprepareResources
        tasks.spawn("reconcile", self.reclaimer.run())
        s = self.settings
        if self.api is not None and s.publish_inventory:
            writer = Publisher(self.api, s.node_name, self.names, label_prefix=s.node_label_prefix)
            tasks.spawn("publish", publish(self.inventory, writer, self.client))
        if self.api is not None:
            tasks.spawn("fence", follow_fence(self.api, s.node_name, self.inventory))
        else:
            self.inventory.fence_known.set()  # nothing to read it from: nothing is fenced

    def health(self, registered: set[str], unregistered: dict[str, str]) -> tuple[bool, str]:
        """(alive, why) for /healthz, with the mode's registration (:func:`health_report`)."""
        return health_report(
            connected=self.follower.connected.is_set(),
            known_devices=len(self.inventory.view().devices),
            runtime_error=self.follower.last_error,
            registered=registered,
            unregistered=unregistered,
        )

    async def close(self) -> None:
        await self.client.close()
        await self.reclaimer.kubelet.close()
        if self.api is not None:
            await self.api.close()


def names_of(s: Settings) -> ResourceNames:
    return ResourceNames(
        gpu=s.resource_gpu,
        gpu_core=s.resource_gpu_core,
        gpu_memory=s.resource_gpu_memory,
        ppu=s.resource_ppu,
        gpu_vfio=s.resource_gpu_vfio,
        enabled=frozenset(s.enabled),
        mig_strategy=s.mig_strategy,
    )


def ours(names: ResourceNames) -> Callable[[str], bool]:
    """Whether a Runtime allocation's resource is one this plugin advertises."""
    exact = {names.gpu, names.gpu_core, names.gpu_memory, names.ppu}
    return lambda r: r in exact or r.startswith(names.gpu + "-mig-")


async def connect(s: Settings, metrics: PluginMetrics) -> Parts:
    client = RuntimeClient(
        s.socket_dir,
        s.rpc_timeout,
        on_garbage=lambda m: metrics.runtime_garbage.labels(m).inc(),
        on_dropped=lambda f: metrics.runtime_values_dropped.labels(f).inc(),
        restart_grace=s.runtime_restart_grace,
    )
    api = await _apiserver(s)
    return Parts(
        s,
        names_of(s),
        metrics,
        Inventory(),
        client,
        api,
        _pod_lister(s, api),
        _events(s, api, metrics),
    )


def _events(s: Settings, api: Any, metrics: PluginMetrics) -> PodEvents:
    """Warning Events on pods through the apiserver (only the log line without one), each
    counted by reason, the ones the overall rate limit leaves out too."""

    async def post(pod: PodView, reason: str, message: str) -> None:
        await post_event(api, (pod.namespace, pod.name, pod.uid), reason, message, node=s.node_name)
        metrics.events.labels(reason).inc()

    return PodEvents(
        post if api is not None else None,
        dropped=lambda r: metrics.events_dropped.labels(r).inc(),
    )


def build(parts: Parts, reclaiming: Reclaiming) -> Node:
    reclaimer = _reclaimer(parts, reclaiming)
    # a Runtime or kubelet that comes back is reconciled at once
    follower = HealthFollower(
        parts.client, parts.inventory, parts.settings.health_interval, on_connect=reclaimer.wake
    )
    return Node(**vars(parts), reclaimer=reclaimer, follower=follower)


async def _track(inventory: Inventory, metrics: PluginMetrics, follower: HealthFollower) -> None:
    view = inventory.view()
    while True:
        # the Runtime's health: a fenced device is unavailable, not unhealthy
        healthy = sum(d.healthy or bool(d.fenced) for d in view.devices)
        metrics.devices.labels("true").set(healthy)
        metrics.devices.labels("false").set(len(view.devices) - healthy)
        metrics.runtime_up.set(1 if follower.connected.is_set() else 0)
        view = await inventory.changed(view.generation)


async def _facts(client: RuntimeClient) -> DriverFacts | None:
    """The driver facts for the labels; None while the Runtime does not answer (logged)."""
    try:
        facts = await driver_facts(client)
    except RuntimeUnavailable as e:
        log.warning("driver_facts_unavailable", error=str(e), kept="the last known facts")
        return None
    log.info(
        "driver_facts",
        driver_version=facts.driver_version or "unknown",
        compute_capability=dict(facts.compute_capability),
    )
    return facts


async def publish(
    inventory: Inventory,
    publisher: Writer,
    client: RuntimeClient,
    handover: Handover | None = None,
    changes: Changes | None = None,
) -> None:
    """One write per change of the inventory (never on a timer); failures retried on change.

    The driver facts are asked again only when the Runtime (its GetVersion) or the set of
    devices changed: they are properties of the driver and the hardware, not of health. While
    the Runtime does not answer the last known ones stay, so labels do not flap with a restart.
    With ``handover`` (the slices) nothing is written before its first answer, and each change
    of it is a change too; ``changes`` says what else is one (a slice someone else deleted).
    """

    async def changed(view: View, seen: int) -> tuple[View, int]:
        return await next_change(inventory, view, handover, seen)

    if handover is not None:
        await handover.known.wait()
    seen = handover.generation if handover is not None else 0
    view = inventory.view()
    facts: DriverFacts | None = None
    asked: object = None
    while True:
        if view.devices:
            key = (view.runtime, tuple(sorted(d.id for d in view.devices)))
            if key != asked and (fresh := await _facts(client)) is not None:
                facts, asked = fresh, key
            try:
                await publisher.publish(list(view.devices), view.runtime, facts)
            except ApiserverUnavailable as e:
                log.warning("inventory_publish_failed", error=str(e), next="retry in 5s")
                await asyncio.sleep(5)
                continue
        view, seen = await (changes or changed)(view, seen)


async def follow_fence(api: Any, node: str, inventory: Inventory) -> None:
    """Until cancelled: the node's fence annotation (:mod:`.fence`) into the inventory, on
    every change of the Node (list, then watch; errors retried with the suite's backoff)."""

    def seen(kind: str, obj: dict[str, Any]) -> None:
        fenced = {} if kind == "DELETED" else fence.of_node(obj)
        if fenced != pending[0] or not inventory.fence_known.is_set():
            pending[0] = fenced
            wake.set()

    pending: list[dict[str, str]] = [{}]
    wake = asyncio.Event()
    informer: Informer[dict[str, Any]] = Informer(
        "nodes",
        lambda: list_node(api, node),
        lambda rv: watch_node(api, node, rv),
        seen,
        gone=(WatchExpired,),
        retry=(ApiserverUnavailable,),
        resume_after_error=True,
        log=log.bind(node=node, watch="fence"),
    )

    async def apply() -> None:
        while True:
            await wake.wait()
            wake.clear()
            fenced = pending[0]
            if await inventory.set_fence(fenced):
                log.info(
                    "devices_fenced" if fenced else "devices_unfenced",
                    node=node,
                    devices=sorted(fenced),
                    reason=next(iter(fenced.values()), ""),
                )

    async with asyncio.TaskGroup() as group:
        group.create_task(informer.run())
        group.create_task(apply())


async def fence_read(inventory: Inventory, wait_s: float) -> None:
    """Return once the node's fence is known, or after ``wait_s`` (logged): a plugin that
    registered before it would offer fenced GPUs for a moment; one that never registered because
    the apiserver is away would offer none at all."""
    try:
        await asyncio.wait_for(inventory.fence_known.wait(), wait_s)
    except TimeoutError:
        log.warning(
            "fence_unknown",
            waited_s=wait_s,
            effect="registering without the node's fence; applied once the apiserver answers",
            check="the apiserver and the plugin's RBAC (nodes list, watch)",
            annotation=fence.FENCE_ANNOTATION,
        )


async def _apiserver(s: Settings) -> Any:
    try:
        return await api_client(s.kubeconfig)
    except ConfigException as e:
        log.warning(
            "apiserver_not_configured",
            error=str(e),
            disabled="NodeDevices, node labels, shared-GPU handshake via apiserver",
            fix="run in a pod with a ServiceAccount or pass --kubeconfig",
        )
        return None


def _pod_lister(s: Settings, api: Any) -> PodLister | None:
    """The pods on this node from the configured source; None when it cannot be reached."""

    async def from_kubelet() -> list[PodView]:
        pods = await kubelet_pods(s.kubelet_pods_url)
        return [v for p in pods if (v := pod_view(p)) is not None]

    async def from_apiserver() -> list[PodView]:
        pods = await node_pods(api, s.node_name)
        return [v for p in pods if (v := pod_view(p)) is not None]

    if s.pods_source == "kubelet" or (s.pods_source == "auto" and api is None):
        return from_kubelet
    if s.pods_source == "apiserver":
        return from_apiserver if api is not None else None
    return FallbackPods(from_kubelet, from_apiserver, node=s.node_name)


def _reclaimer(parts: Parts, reclaiming: Reclaiming) -> Reclaimer:
    s, names, inventory = parts.settings, parts.names, parts.inventory
    states = None
    if parts.pods is not None:
        lister = parts.pods

        async def states_of() -> list[PodState] | None:
            try:
                return [pod_state(v) for v in await lister()]
            except PodsUnavailable as e:
                # /pods reads the kubelet's own pod manager, as pod-resources does: without it a
                # pass loses only the uid and phase checks, so it goes on (an apiserver source's
                # failure, ApiserverUnavailable, still skips the pass)
                log.info("reconcile_without_pod_list", error=str(e))
                return None

        states = states_of
    return Reclaimer(
        parts.client,
        PodResourcesClient(s.pod_resources_socket, s.rpc_timeout),
        ours(names),
        frozenset({names.gpu_core, names.gpu_memory}),
        pods=states,
        capabilities=lambda: inventory.view().runtime.capabilities,
        interval_s=s.reconcile_interval,
        grace_s=s.release_grace,
        metrics=parts.metrics,
        claimed=reclaiming.claimed,
        on_listed=reclaiming.on_listed,
        listed_pods_hold=reclaiming.listed_pods_hold,
    )


def health_report(
    *,
    connected: bool,
    known_devices: int,
    runtime_error: str,
    registered: set[str],
    unregistered: dict[str, str],
) -> tuple[bool, str]:
    """(alive, why) for /healthz.

    Failing only before the Runtime ever answered: afterwards the plugin keeps serving the last
    known devices to the kubelet, and a restart (what a failing liveness probe causes) would only
    lose them, so a misbehaving Runtime or a refused registration reads 200 ``degraded`` with
    the reason.
    """
    problems = []
    if not connected:
        problems.append(f"runtime not connected: {runtime_error or 'no answer yet'}")
    for resource, why in sorted(unregistered.items()):
        problems.append(f"{resource} not registered: {why}")
    if not connected and not known_devices:
        return False, "; ".join(problems)
    head = "degraded" if problems else "ok"
    return True, "; ".join([f"{head}, registered: {sorted(registered)}", *problems])
