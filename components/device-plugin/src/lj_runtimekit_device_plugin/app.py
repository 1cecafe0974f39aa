"""Lifecycle of the device plugin: named tasks, signals, ordered shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog
from aiohttp import web
from kubernetes_asyncio.config import ConfigException

from . import __version__, lifecycle, logs, migration
from .allocate import Allocator
from .annotations import not_passed
from .assignment import PodView
from .dra_plugin import DraHost
from .dra_publish import SlicePublisher
from .handover import Handover, held_taints, next_change
from .handshake import PodLister, SharedHandshake
from .health import HealthFollower
from .httpd import create_app
from .inventory import Inventory, View
from .kube import (
    ApiserverUnavailable,
    MarkUpdate,
    Publisher,
    api_client,
    mark_pod,
    node_pods,
    post_event,
)
from .kubelet import PodsUnavailable, kubelet_pods
from .metrics import PluginMetrics
from .model import Injection
from .plugins import PluginHost
from .podresources import PodResourcesClient
from .podview import pod_state, pod_view
from .reclaim import Listed, Reclaimer
from .reconcile import PodState
from .resources import ResourceNames
from .runtime import DriverFacts, RuntimeClient, RuntimeUnavailable, driver_facts
from .settings import Settings

log = structlog.get_logger(__name__)


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


async def _track(inventory: Inventory, metrics: PluginMetrics, follower: HealthFollower) -> None:
    view = inventory.view()
    while True:
        healthy = sum(d.healthy for d in view.devices)
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


async def _publish(
    inventory: Inventory,
    publisher: Publisher | SlicePublisher,
    client: RuntimeClient,
    handover: Handover | None = None,
) -> None:
    """One write per change of the inventory (never on a timer); failures retried on change.

    The driver facts are asked again only when the Runtime (its GetVersion) or the set of
    devices changed: they are properties of the driver and the hardware, not of health. While
    the Runtime does not answer the last known ones stay, so labels do not flap with a restart.
    With ``handover`` (the slices) nothing is written before its first answer, and each change
    of it is a change too.
    """
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
        view, seen = await _next(inventory, view, handover, seen, publisher)


async def _next(
    inventory: Inventory,
    view: View,
    handover: Handover | None,
    seen: int,
    publisher: Publisher | SlicePublisher,
) -> tuple[View, int]:
    """The next change to publish: of the inventory or handover, or (slices) the loss of a
    slice someone else deleted (:meth:`SlicePublisher.watch`)."""
    if not isinstance(publisher, SlicePublisher):
        return await next_change(inventory, view, handover, seen)
    change = asyncio.ensure_future(next_change(inventory, view, handover, seen))
    lost = asyncio.ensure_future(publisher.lost.wait())
    try:
        await asyncio.wait({change, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        change.cancel()
        lost.cancel()
    publisher.lost.clear()
    if change.done() and not change.cancelled():
        return change.result()
    return inventory.view(), handover.generation if handover is not None else seen


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

    if s.pods_source == "kubelet":
        return from_kubelet
    return from_apiserver if api is not None else None


def _handshake(
    s: Settings,
    client: RuntimeClient,
    names: ResourceNames,
    api: Any,
    pods: PodLister | None,
    *,
    room: Reclaimer,
    metrics: PluginMetrics,
    inventory: Inventory,
) -> Any:
    async def mark(pod: PodView, update: MarkUpdate) -> None:
        await mark_pod(api, pod.namespace, pod.name, pod.uid, update)

    async def event(pod: PodView, reason: str, message: str) -> None:
        await post_event(api, (pod.namespace, pod.name, pod.uid), reason, message, node=s.node_name)
        metrics.events.labels(reason).inc()

    if api is None or pods is None:
        return None
    return SharedHandshake(
        client,
        names,
        s.node_name,
        pods,
        mark,
        post_event=event,
        room=room,
        devices=lambda: inventory.view().devices,
    )


def ours(names: ResourceNames) -> Callable[[str], bool]:
    """Whether a Runtime allocation's resource is one this plugin advertises."""
    exact = {names.gpu, names.gpu_core, names.gpu_memory, names.ppu}
    return lambda r: r in exact or r.startswith(names.gpu + "-mig-")


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


def _reclaimer(
    s: Settings,
    client: RuntimeClient,
    *,
    names: ResourceNames,
    inventory: Inventory,
    pods: PodLister | None,
    metrics: PluginMetrics,
    dra: DraHost | None = None,
    on_listed: Listed | None = None,
) -> Reclaimer:
    states = None
    if pods is not None:
        lister = pods

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
        client,
        PodResourcesClient(s.pod_resources_socket, s.rpc_timeout),
        ours(names),
        frozenset({names.gpu_core, names.gpu_memory}),
        pods=states,
        capabilities=lambda: inventory.view().runtime.capabilities,
        interval_s=s.reconcile_interval,
        grace_s=s.release_grace,
        metrics=metrics,
        claimed=dra.plugin.settled if dra is not None else None,
        on_listed=on_listed,
        listed_pods_hold=s.mode == "dra",
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


def _health(
    follower: HealthFollower, inventory: Inventory, host: PluginHost | DraHost
) -> Callable[[], tuple[bool, str]]:
    def healthy() -> tuple[bool, str]:
        if isinstance(host, DraHost):
            reg = host.registration
            registered = {host.driver} if reg.registered.is_set() else set()
            unregistered = {host.driver: reg.refusal} if reg.refusal else {}
        else:
            registered, unregistered = host.registered, host.unregistered
        return health_report(
            connected=follower.connected.is_set(),
            known_devices=len(inventory.view().devices),
            runtime_error=follower.last_error,
            registered=registered,
            unregistered=unregistered,
        )

    return healthy


def _plugin_host(
    s: Settings,
    inventory: Inventory,
    names: ResourceNames,
    allocator: Allocator,
    *,
    metrics: PluginMetrics,
    reclaimer: Reclaimer,
    withheld: Handover | None = None,
) -> PluginHost:
    def registered(resource: str) -> None:
        metrics.registered(resource)
        reclaimer.wake()

    def refused(resource: str) -> None:
        metrics.registration_failures.labels(resource).inc()

    host = PluginHost(
        s.plugin_dir,
        inventory,
        names,
        allocator,
        observe=metrics.observe,
        on_registered=registered,
        on_refused=refused,
        intent=allocator.intent,
        withheld=withheld,
    )
    metrics.follow_registrations(host.registration_state)
    return host


def _spawn_publishers(
    tasks: lifecycle.Tasks,
    s: Settings,
    api: Any,
    *,
    names: ResourceNames,
    inventory: Inventory,
    client: RuntimeClient,
    dra: bool,
    handover: Handover | None,
    withdraw: bool,
) -> None:
    """NodeDevices and labels (both modes), and the ResourceSlices in mode dra (what the
    device plugin holds tainted); in mode device-plugin after mode dra, the slices withdrawn."""
    if api is not None and s.publish_inventory:
        publisher = Publisher(api, s.node_name, names, label_prefix=s.node_label_prefix)
        tasks.spawn("publish", _publish(inventory, publisher, client))
    if dra or (withdraw and api is not None):
        slices = SlicePublisher(
            api,
            s.node_name,
            driver=s.dra_driver_name,
            partitions=s.dra_partitions,
            taints=lambda: held_taints(handover.held if handover is not None else {}),
            topology_labels=s.topology_labels,
        )
        job = _publish(inventory, slices, client, handover) if dra else None
        tasks.spawn("slices", job or migration.withdraw_slices(slices))
        if dra:
            tasks.spawn("slices-watch", slices.watch())


async def _first(awaitable: Coroutine[Any, Any, Any], tasks: lifecycle.Tasks) -> None:
    """Wait for ``awaitable`` or for the tasks to stop, whichever comes first."""
    first = asyncio.create_task(awaitable)
    stopping = asyncio.create_task(tasks.wait())
    await asyncio.wait({first, stopping}, return_when=asyncio.FIRST_COMPLETED)
    first.cancel()
    stopping.cancel()


async def serve(
    s: Settings,
    stop: asyncio.Event | lifecycle.Tasks,
    *,
    bound: Callable[[int], None] | None = None,
) -> None:
    """Run until ``stop`` is set; then stop serving, remove our sockets, close clients.

    Pass :class:`lifecycle.Tasks` to learn afterwards (``fatal``) whether a failed task, not a
    signal, ended it."""
    tasks = stop if isinstance(stop, lifecycle.Tasks) else lifecycle.Tasks(stop)
    names = names_of(s)
    metrics = PluginMetrics()
    inventory = Inventory()
    client = RuntimeClient(
        s.socket_dir, s.rpc_timeout, on_garbage=lambda m: metrics.runtime_garbage.labels(m).inc()
    )
    api = await _apiserver(s)
    pods = _pod_lister(s, api)
    dra = s.mode == "dra"
    dra_host, handover, unprepared = migration.dra_parts(s, client, api, names, inventory)
    reclaimer = _reclaimer(
        s,
        client,
        names=names,
        inventory=inventory,
        pods=pods,
        metrics=metrics,
        dra=dra_host if handover is not None else None,
        on_listed=migration.tracker(handover, lambda: inventory.view().devices, dra=dra)
        if handover is not None
        else None,
    )
    # a Runtime or kubelet that comes back is reconciled at once
    follower = HealthFollower(client, inventory, s.health_interval, on_connect=reclaimer.wake)
    allocator = Allocator(
        client,
        names,
        s.allocate_timeout,
        _handshake(
            s, client, names, api, pods, room=reclaimer, metrics=metrics, inventory=inventory
        ),
        release_stale=reclaimer.release_stale,
        check=annotation_check(s.annotation_patterns, metrics),
        pods=pods,
        node=s.node_name,
        room=reclaimer,
        devices=lambda: inventory.view().devices,
    )

    host = _plugin_host(
        s,
        inventory,
        names,
        allocator,
        metrics=metrics,
        reclaimer=reclaimer,
        withheld=None if dra else handover,
    )
    runner = web.AppRunner(
        create_app(metrics, _health(follower, inventory, dra_host if dra and dra_host else host))
    )
    await runner.setup()
    await web.TCPSite(runner, *s.metrics_address).start()
    if s.probe_address is not None:
        # the probe address serves the same routes: kubelet probes reach /healthz there
        await web.TCPSite(runner, *s.probe_address).start()
    if bound is not None:
        bound(int(runner.addresses[0][1]))  # the real port when the bind address asks for 0
    for name, job in (
        ("watch", follower.watch()),
        ("poll", follower.poll()),
        ("metrics", _track(inventory, metrics, follower)),
    ):
        tasks.spawn(name, job)
    # the device plugin API's allocations only (also in mode dra: those of pods from before the
    # switch); a prepared claim's the kubelet releases through NodeUnprepareResources
    tasks.spawn("reconcile", reclaimer.run())
    _spawn_publishers(
        tasks,
        s,
        api,
        names=names,
        inventory=inventory,
        client=client,
        dra=dra,
        handover=handover,
        withdraw=dra_host is not None,
    )
    if (nri := migration.nri_plugin(s)) is not None:
        tasks.spawn("nri", nri.run())
    if not dra and dra_host is not None and handover is not None:
        tasks.spawn("dra-unprepare", migration.hand_back(dra_host, unprepared, reclaimer.wake))
    # Registering before the first inventory would advertise nothing: wait for it (or stop).
    await _first(follower.connected.wait(), tasks)
    if not tasks.stop.is_set() and not dra and handover is not None:
        # the devices prepared claims hold must be known before the kubelet hears of any
        await _first(handover.known.wait(), tasks)
    if not tasks.stop.is_set():
        if dra and dra_host is not None:
            await dra_host.start()
        else:
            tasks.spawn("plugins", host.run())
        await tasks.wait()
    log.info("shutting_down")
    await tasks.cancel()
    await host.stop()
    if dra_host is not None:
        await dra_host.stop()
    await runner.cleanup()
    if dra_host is not None and dra_host.plugin.preparer.partitions is not None:
        await dra_host.plugin.preparer.partitions.close()
    await client.close()
    await reclaimer.kubelet.close()
    if api is not None:
        await api.close()


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """Serve until a signal (exit 0) or a fatal error (exit 1, never 0: a pod that ended on an
    error must not read "Completed" in CrashLoopBackOff); a second signal exits 130 at once."""
    logs.configure(
        settings.log_level, None if settings.log_format == "auto" else settings.log_format == "json"
    )
    for note in deprecations:
        log.warning("deprecated_setting", note=note)
    log.info("starting", version=__version__, settings=vars(settings))

    async def main(tasks: lifecycle.Tasks) -> None:
        await serve(settings, tasks)

    try:
        return lifecycle.run(main, name="device_plugin")
    except OSError as e:
        log.error(
            "device_plugin_not_started",
            error=str(e),
            check=f"is {settings.metrics_bind_address} free (--metrics-bind-address), and are "
            f"{settings.plugin_dir} and {settings.socket_dir} reachable?",
            exit_code=lifecycle.EXIT_FAILED,
        )
        return lifecycle.EXIT_FAILED
