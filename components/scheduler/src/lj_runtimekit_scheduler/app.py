"""Lifecycle of the scheduler: named tasks (:mod:`.lifecycle`), signals, ordered shutdown."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import asdict
from typing import Any

import structlog

from . import lifecycle, logs
from .errors import PermanentError
from .events import EventRecorder
from .feed import Informers
from .feed import tasks as informer_tasks
from .kube import Kube, Lease
from .leader import Elector
from .metrics import Metrics
from .profile import build_profile
from .queue import SchedulingQueue
from .scheduler import Scheduler
from .server import add_site, create_server
from .settings import Settings
from .state import ClusterState

log = structlog.get_logger("lj_runtimekit_scheduler.app")


def elector(settings: Settings, kube: Kube, identity: str) -> Elector:
    namespace = settings.leader_elect_resource_namespace
    name = settings.leader_elect_resource_name
    return Elector(
        Lease(kube, namespace, name),
        identity,
        namespace=namespace,
        name=name,
        lease_duration=settings.leader_elect_lease_duration,
        renew_deadline=settings.leader_elect_renew_deadline,
        retry_period=settings.leader_elect_retry_period,
    )


async def serve(settings: Settings, tasks: lifecycle.Tasks) -> None:
    """Schedule until a signal, a failed task or the loss of the Lease (then ``tasks.fatal``
    says which). Raises what stops it from starting: a kubeconfig that does not load, an
    unknown plugin (:class:`PermanentError`), a bind address in use (``OSError``)."""
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    kube = await Kube.connect(settings)
    kube.identity = identity
    try:
        await _serve(settings, tasks, kube, identity)
    finally:
        await kube.close()


async def _serve(settings: Settings, tasks: lifecycle.Tasks, kube: Kube, identity: str) -> None:
    metrics = Metrics()
    state = ClusterState(settings.resources, settings.dra_driver_name)
    queue = SchedulingQueue(
        settings.pod_initial_backoff, settings.pod_max_backoff, settings.unschedulable_retry
    )
    recorder = EventRecorder(kube, interval_s=settings.event_series_interval)
    sched = Scheduler(
        settings,
        state=state,
        queue=queue,
        profile=build_profile(settings, state, metrics),
        binder=kube,
        recorder=recorder,
        metrics=metrics,
        evictor=kube,
        groups=kube,
    )
    informers = Informers(kube, settings, state, queue, sched.poke, recorder=recorder)
    # checked by Settings only when it is used: built only then
    lease = elector(settings, kube, identity) if settings.leader_elect else None
    lost = lease.lost if lease is not None else asyncio.Event()
    serving = True

    def degraded() -> list[str]:
        return [f"{kind} list/watch failing: {e}" for kind, e in informers.failing.items()]

    host, port = settings.metrics_address
    runner, port = await create_server(metrics, lambda: serving, host, port, degraded)
    try:
        if settings.probe_address is not None:
            # the probe address serves the same routes: kubelet probes reach /healthz there
            await add_site(runner, *settings.probe_address)
        log.info("serving", port=port, identity=identity)
        if lease is not None:
            tasks.spawn("leader", lease.run())
            await _first_of(tasks.stop.wait(), lease.leading.wait())
            metrics.leader(lease.leading.is_set())
        for name, coro in informer_tasks(informers).items():
            tasks.spawn(name, coro)
        await _first_of(tasks.stop.wait(), informers.synced["pods"].wait())
        await _first_of(tasks.stop.wait(), informers.wait_synced())
        sched_stop = asyncio.Event()
        tasks.spawn("scheduler", sched.run(sched_stop))
        await _first_of(tasks.wait(), lost.wait())
        if lost.is_set() and not tasks.fatal:
            # exit 1 so that the pod restarts as a follower
            tasks.fatal = "lost the leader Lease"
        sched_stop.set()
        serving = False
        await asyncio.wait_for(sched.drain(), 10) if sched.binding else None
        if lease is not None:
            await lease.release()  # a follower takes over at once, not after the lease duration
    finally:
        await tasks.cancel()
        await recorder.close()
        await runner.cleanup()


async def _first_of(*coros: Coroutine[Any, Any, Any]) -> None:
    waits = [asyncio.ensure_future(c) for c in coros]
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """Exit 0 after a signal; 1 when a task fails, the Lease is lost or a bind address is in
    use; 2 for a setting found wrong only at start (a kubeconfig that does not load, an unknown
    plugin); a second signal exits 130."""
    logs.configure(settings.log_level, settings.log_format)
    for note in deprecations:
        log.warning("deprecated_setting", note=note)
    log.info(
        "effective_config",
        pid=os.getpid(),
        **{k: v for k, v in asdict(settings).items() if k != "plugins"},
        plugins=[f"{p.name}:{p.weight}" for p in settings.plugins],
    )

    async def main(tasks: lifecycle.Tasks) -> None:
        await serve(settings, tasks)

    try:
        return lifecycle.run(main, name="scheduler")
    except PermanentError as e:
        log.error("cannot_start", error=str(e), exit_code=lifecycle.EXIT_USAGE)
        return lifecycle.EXIT_USAGE
    except OSError as e:
        log.error(
            "cannot_start",
            error=f"cannot serve on {settings.metrics_bind_address}: {e}",
            check="is the address free? (--metrics-bind-address, --health-probe-bind-address)",
            exit_code=lifecycle.EXIT_FAILED,
        )
        return lifecycle.EXIT_FAILED
