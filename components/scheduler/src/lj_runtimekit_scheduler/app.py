"""Lifecycle of the scheduler: named tasks, signals, ordered shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import uuid
from collections.abc import Coroutine
from dataclasses import asdict
from typing import Any

import structlog

from . import logs
from .errors import PermanentError
from .events import EventRecorder
from .informer import Informers, tasks
from .kube import Kube
from .leader import Elector
from .metrics import Metrics
from .queue import SchedulingQueue
from .scheduler import Scheduler, build_profile
from .server import create_server
from .settings import Settings
from .state import ClusterState

log = structlog.get_logger("lj_runtimekit_scheduler.app")


#: Exit code of a second SIGTERM/SIGINT (the shell's 128 + SIGINT), the same in every daemon.
EXIT_FORCED = 130

crashed: list[str] = []
"""Tasks that ended with an exception: the process then exits 1, never 0."""


def _guard(name: str, coro: Coroutine[Any, Any, None], stop: asyncio.Event) -> asyncio.Task[None]:
    async def guarded() -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("task_crashed", task=name)
            crashed.append(name)
            stop.set()

    return asyncio.create_task(guarded(), name=name)


async def serve(settings: Settings, stop: asyncio.Event) -> int:
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    kube = await Kube.connect(settings)
    kube.identity = identity
    metrics = Metrics()
    state, queue = (
        ClusterState(settings.resources),
        SchedulingQueue(
            settings.backoff_initial_s, settings.backoff_max_s, settings.unschedulable_retry_s
        ),
    )
    sched = Scheduler(
        settings,
        state=state,
        queue=queue,
        profile=build_profile(settings, state, metrics),
        binder=kube,
        recorder=EventRecorder(kube, interval_s=settings.event_series_interval_s),
        metrics=metrics,
    )
    informers = Informers(kube, settings, state, queue, sched.poke)
    elector = Elector(kube, settings, identity)
    serving = True

    def degraded() -> list[str]:
        return [f"{kind} list/watch failing: {e}" for kind, e in informers.failing.items()]

    try:
        runner, port = await create_server(
            metrics, lambda: serving, "0.0.0.0", settings.metrics_port, degraded
        )
    except OSError as e:
        await kube.close()
        raise PermanentError(f"cannot serve on port {settings.metrics_port}: {e}") from e
    log.info("serving", port=port, identity=identity)
    running: list[asyncio.Task[None]] = []
    try:
        if settings.leader_elect:
            running.append(_guard("leader", elector.run(), stop))
            await _first(stop, elector.leading)
            metrics.leader(elector.leading.is_set())
        running += [_guard(n, c, stop) for n, c in tasks(informers).items()]
        await _first(stop, informers.synced["pods"])
        await informers.wait_synced() if not stop.is_set() else None
        sched_stop = asyncio.Event()
        running.append(_guard("scheduler", sched.run(sched_stop), stop))
        waits = [stop.wait()] + ([elector.lost.wait()] if settings.leader_elect else [])
        await _first_of(*waits)
        lost = elector.lost.is_set()
        sched_stop.set()
        serving = False
        await asyncio.wait_for(sched.drain(), 10) if sched.binding else None
        if crashed:
            log.error("exiting_after_crash", tasks=crashed)
        return 1 if lost or crashed else 0
    finally:
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await runner.cleanup()
        await kube.close()


async def _first(stop: asyncio.Event, event: asyncio.Event) -> None:
    await _first_of(stop.wait(), event.wait())


async def _first_of(*coros: Coroutine[Any, Any, Any]) -> None:
    tasks_ = [asyncio.ensure_future(c) for c in coros]
    _, pending = await asyncio.wait(tasks_, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()


def run(settings: Settings) -> int:
    logs.configure(settings.log_level)
    log.info(
        "effective_config",
        pid=os.getpid(),
        **{k: v for k, v in asdict(settings).items() if k != "plugins"},
        plugins=[f"{p.name}:{p.weight}" for p in settings.plugins],
    )

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        hits = 0

        def on_signal() -> None:
            nonlocal hits
            hits += 1
            if hits > 1:
                log.warning("forced_exit", exit_code=EXIT_FORCED)
                os._exit(EXIT_FORCED)  # a second signal forces exit, whatever is still running
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        return await serve(settings, stop)

    try:
        return asyncio.run(main())
    except PermanentError as e:
        log.error("cannot_start", error=str(e))
        return 2
    except Exception:  # a bug: say so, and never exit 0 ("Completed") after it
        log.exception("scheduler_crashed")
        return 1
