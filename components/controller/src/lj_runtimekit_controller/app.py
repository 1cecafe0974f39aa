"""Lifecycle of the controller: HTTP first, then the Lease, then the action loop while leading."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog

from . import __version__, lifecycle, logs, server
from .actions import ActionLoop
from .errors import ControllerError
from .kube import Kube, LeaseObject, api_client
from .leader import Elector
from .metrics import Metrics
from .ratelimit import TokenBucket
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_controller")

#: Exit code of a second SIGTERM/SIGINT (the shell's 128 + SIGINT), the same in every daemon.
EXIT_FORCED = lifecycle.EXIT_FORCED


class Controller:
    """One replica: serves /metrics and /healthz, leads or waits, and reconciles while leading.

    ``run()`` returns the exit code: 0 after ``stop`` (a signal), 1 when a task failed or the
    Lease was lost. Its tasks run under ``tasks``, whose guard records a failed one and sets
    ``stop``."""

    def __init__(self, settings: Settings, tasks: lifecycle.Tasks | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.tasks = tasks if tasks is not None else lifecycle.Tasks()
        self.stop = self.tasks.stop
        self.running: dict[str, asyncio.Task[None]] = {}
        self.port = 0
        self.loop: ActionLoop | None = None

    @property
    def crashed(self) -> list[str]:
        """Tasks that ended with an exception: the process then exits 1, never 0."""
        return [self.tasks.fatal] if self.tasks.fatal else []

    def degraded(self) -> list[str]:
        failing = self.loop.failing if self.loop is not None else {}
        return [f"{kind} list/watch failing: {e}" for kind, e in failing.items()]

    def health(self) -> str | None:
        for name, task in self.running.items():
            if task.done():
                return f"task {name} ended"
        return None

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self.running[name] = self.tasks.spawn(name, coro)

    async def run(self) -> int:
        s = self.settings
        api = await api_client(s.kubeconfig)
        kube = Kube(
            api,
            TokenBucket(s.kube_api_qps, s.kube_api_burst),
            lambda verb: self.metrics.api_requests.labels(verb).inc(),
        )
        host, port = s.metrics_address
        try:
            runner, self.port = await server.start(
                server.create_app(self.metrics, self.health, self.degraded), host, port
            )
            if s.probe_address is not None:
                # the probe address serves the same routes: kubelet probes reach /healthz there
                await server.add_site(runner, *s.probe_address)
        except OSError as e:
            await api.close()
            raise ControllerError(f"cannot serve on {s.metrics_bind_address}: {e}") from e
        log.info("serving", address=host, port=self.port)
        elector: Elector | None = None
        if s.leader_elect:  # built only when used: its timing checks concern only the Lease
            elector = Elector(
                LeaseObject(kube, s.leader_elect_resource_namespace, s.leader_elect_resource_name),
                s.identity,
                namespace=s.leader_elect_resource_namespace,
                name=s.leader_elect_resource_name,
                lease_duration=s.leader_elect_lease_duration,
                renew_deadline=s.leader_elect_renew_deadline,
                retry_period=s.leader_elect_retry_period,
            )
        code = lifecycle.EXIT_OK
        try:
            if elector is not None:
                self._spawn("leader", elector.run())
                await _first(elector.leading.wait(), self.stop.wait())
            if not self.stop.is_set():
                self.metrics.leader.set(1)
                self._start_loop(kube)
                if elector is not None:
                    await _first(elector.lost.wait(), self.stop.wait())
                else:
                    await self.stop.wait()
                if elector is not None and elector.lost.is_set():
                    log.error("leadership_lost_exiting")
                    code = lifecycle.EXIT_FAILED
        finally:
            await self.tasks.cancel()
            if elector is not None:
                await elector.release()  # logs and swallows its own errors
            self.metrics.leader.set(0)
            await runner.cleanup()
            await api.close()
        if self.crashed:
            log.error("exiting_after_crash", tasks=self.crashed)
            return lifecycle.EXIT_FAILED
        return code

    def _start_loop(self, kube: Kube) -> None:
        self.loop = ActionLoop(self.settings, kube, self.metrics)
        self._spawn("sync-nodes", self.loop.sync("nodes"))
        self._spawn("sync-jobs", self.loop.sync("jobs"))
        self._spawn("sync-configmaps", self.loop.sync("configmaps"))
        for i in range(self.settings.concurrency):
            self._spawn(f"worker-{i}", self.loop.worker())


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    pending = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for p in pending:
            p.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await p


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """Exit 0 after a signal; 1 when a task failed, the Lease was lost, the port is taken or the
    credentials do not load; a second signal exits 130 at once (lifecycle)."""
    logs.configure(settings.log_level, settings.log_format)
    for note in deprecations:
        log.warning("deprecated_setting", note=note)
    log.info("starting", version=__version__, settings=dataclasses.asdict(settings))
    code = lifecycle.EXIT_OK

    async def main(tasks: lifecycle.Tasks) -> None:
        nonlocal code
        try:
            code = await Controller(settings, tasks).run()
        except ControllerError as e:
            log.error("controller_failed", error=str(e), exit_code=lifecycle.EXIT_FAILED)
            code = lifecycle.EXIT_FAILED
        except Exception:  # a bug: say so, and never exit 0 ("Completed") after it
            log.exception("controller_crashed", exit_code=lifecycle.EXIT_FAILED)
            code = lifecycle.EXIT_FAILED

    return max(lifecycle.run(main, name="controller"), code)
