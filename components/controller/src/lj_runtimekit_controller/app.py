"""Lifecycle of the controller: HTTP first, then the Lease, then the action loop while leading."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Coroutine
from typing import Any

import structlog

from . import __version__, logs, server
from .actions import ActionLoop
from .errors import ControllerError
from .kube import ApiRate, Kube, api_client
from .leader import LeaderElector
from .metrics import Metrics
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_controller")

#: Exit code of a second SIGTERM/SIGINT (the shell's 128 + SIGINT), the same in every daemon.
EXIT_FORCED = 130


class Controller:
    """One replica: serves /metrics and /healthz, leads or waits, and reconciles while leading."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.stop = asyncio.Event()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.port = 0
        self.loop: ActionLoop | None = None
        self.crashed: list[str] = []
        """Tasks that ended with an exception: the process then exits 1, never 0."""

    def degraded(self) -> list[str]:
        failing = self.loop.failing if self.loop is not None else {}
        return [f"{kind} list/watch failing: {e}" for kind, e in failing.items()]

    def health(self) -> str | None:
        for name, task in self.tasks.items():
            if task.done():
                return f"task {name} ended"
        return None

    def _guard(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro, name=name)

        def ended(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("task_failed", task=name, error=repr(t.exception()))
                self.crashed.append(name)
                self.stop.set()

        task.add_done_callback(ended)
        self.tasks[name] = task

    async def run(self) -> int:
        s = self.settings
        api = await api_client(s.kubeconfig)
        kube = Kube(
            api,
            ApiRate(s.api_qps, s.api_burst),
            lambda verb: self.metrics.api_requests.labels(verb).inc(),
        )
        try:
            runner, self.port = await server.start(
                server.create_app(self.metrics, self.health, self.degraded),
                s.listen_address,
                s.port,
            )
        except OSError as e:
            await api.close()
            raise ControllerError(f"cannot serve on {s.listen_address}:{s.port}: {e}") from e
        log.info("serving", port=self.port)
        elector = LeaderElector(
            kube,
            s.namespace,
            s.lease_name,
            s.identity,
            lease_s=s.lease_duration,
            renew_s=s.renew_deadline,
            retry_s=s.retry_period,
        )
        code = 0
        try:
            if s.leader_elect:
                self._guard("leader", elector.run())
                waiter = asyncio.create_task(elector.is_leader.wait())
                stopper = asyncio.create_task(self.stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
            if not self.stop.is_set():
                self.metrics.leader.set(1)
                self._start_loop(kube)
                lost = asyncio.create_task(elector.lost.wait())
                stopper = asyncio.create_task(self.stop.wait())
                await asyncio.wait({lost, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if elector.lost.is_set():
                    log.error("leadership_lost_exiting")
                    code = 1
                lost.cancel()
                stopper.cancel()
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
            if s.leader_elect:
                with contextlib.suppress(ControllerError):
                    await elector.release()
            self.metrics.leader.set(0)
            await runner.cleanup()
            await api.close()
        if self.crashed:
            log.error("exiting_after_crash", tasks=self.crashed)
            return 1
        return code

    def _start_loop(self, kube: Kube) -> None:
        self.loop = ActionLoop(self.settings, kube, self.metrics)
        self._guard("sync-nodes", self.loop.sync("nodes"))
        self._guard("sync-jobs", self.loop.sync("jobs"))
        for i in range(self.settings.concurrency):
            self._guard(f"worker-{i}", self.loop.worker())


async def main(settings: Settings) -> int:
    controller = Controller(settings)
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            # A second signal: out now, whatever still runs (SystemExit raised here would first
            # wait for every task to finish its cancellation: the hang the signal is sent for).
            log.warning("forced_exit", exit_code=EXIT_FORCED)
            os._exit(EXIT_FORCED)
        log.info("stopping")
        controller.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        return await controller.run()
    except ControllerError as e:
        log.error("controller_failed", error=str(e))
        return 1
    except Exception:  # a bug: say so, and never exit 0 ("Completed") after it
        log.exception("controller_crashed")
        return 1


def run(settings: Settings) -> int:
    logs.configure(
        settings.log_level, None if settings.log_format == "auto" else settings.log_format == "json"
    )
    log.info("starting", version=__version__, settings=settings.__dict__)
    return asyncio.run(main(settings))
