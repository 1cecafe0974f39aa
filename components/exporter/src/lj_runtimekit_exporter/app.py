"""Lifecycle of the exporter: the poll task and the HTTP server, signals, ordered shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from typing import Protocol

import structlog
from aiohttp import web

from . import logs, server
from .collector import State
from .errors import ConfigError
from .kubelet import KubeletPods, PodResources
from .poller import PodSource, Poller
from .runtime import RuntimeClient
from .settings import Settings

log = structlog.get_logger(__name__)


class PodFeed(PodSource, Protocol):
    """A pod source with a lifecycle: the kubelet's /pods or the apiserver watch."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class Exporter:
    """The running exporter: ``await start()``, then ``await stop()``; ``port`` once started."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state = State(
            node=settings.node_name,
            pods_source=settings.pods_source,
            pod_resources=bool(settings.pod_resources_socket),
            max_age=settings.max_snapshot_age,
        )
        self.runtime = RuntimeClient(settings.socket_dir, settings.rpc_timeout)
        self.pods: PodFeed | None = None
        if settings.pods_source == "kubelet":
            self.pods = KubeletPods(settings.kubelet_pods_url, settings.kubelet_timeout)
        elif settings.pods_source == "apiserver":
            # imported only when used: the Kubernetes client alone costs ~65 MiB of RSS
            from .kube import ApiserverPods

            self.pods = ApiserverPods(settings.node_name, settings.kubeconfig or None)
        self.pod_resources: PodResources | None = None
        if settings.pod_resources_socket:
            self.pod_resources = PodResources(
                settings.pod_resources_socket, settings.kubelet_timeout
            )
        self.poller = Poller(
            self.state,
            self.runtime,
            self.pods,
            settings.poll_interval,
            held=self.pod_resources,
            fallback=settings.pods_source,
        )
        self.port = 0
        self._stop = asyncio.Event()
        self._poll_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None

    def healthy(self) -> tuple[bool, str]:
        """Alive when the poll task runs and finished a round within three intervals (or 35 s).

        A peer that misbehaves (a Runtime answering garbage, a pod source away) does not fail
        it: the exporter keeps serving what it can, and restarting would not mend the peer; it
        reads 200 ``degraded`` with each source's reason instead."""
        task = self._poll_task
        if task is None or task.done():
            return False, "poll loop not running"
        if self.poller.rounds == 0:
            return True, "starting"
        age = time.monotonic() - self.poller.last_round_at
        limit = max(3 * self.settings.poll_interval, 35.0)
        if age > limit:
            return False, f"last poll finished {age:.0f}s ago"
        problems = self.poller.problems
        if problems:
            return True, "degraded: " + "; ".join(f"{k}: {v}" for k, v in sorted(problems.items()))
        return True, "ok"

    @property
    def failed(self) -> BaseException | None:
        """The error that ended the poll loop, if it ended on one."""
        task = self._poll_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def wait_failed(self) -> None:
        """Return when the poll loop ends on its own (it only ends on an error or a stop)."""
        if self._poll_task is not None:
            await asyncio.wait({self._poll_task})

    async def start(self) -> None:
        if self.pods is not None:
            await self.pods.start()
        if self.pod_resources is not None:
            await self.pod_resources.start()
        self._poll_task = asyncio.create_task(self._guard(), name="poll")
        app = server.create_app(self.state, self.healthy)
        self._runner, self.port = await server.start(
            app, self.settings.listen_address, self.settings.port
        )
        log.info("exporter_serving", address=self.settings.listen_address, port=self.port)

    async def _guard(self) -> None:
        try:
            await self.poller.run(self._stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("poll_loop_crashed", effect="the exporter exits 1; the pod restarts")
            raise

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._poll_task is not None:
            try:
                await asyncio.wait_for(self._poll_task, 5.0)
            except TimeoutError:
                self._poll_task.cancel()
            except Exception:  # noqa: BLE001 - already logged by _guard
                log.debug("poll_task_ended_with_error")
        if self.pods is not None:
            await self.pods.stop()
        if self.pod_resources is not None:
            await self.pod_resources.stop()
        await self.runtime.close()


async def serve(settings: Settings) -> bool:
    """Serve until a signal; False when it stopped because the poll loop failed."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second_signal_forcing_exit")
            raise SystemExit(1)
        log.info("stopping")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    exporter = Exporter(settings)
    try:
        await exporter.start()
        stopping = asyncio.create_task(stop.wait())
        failing = asyncio.create_task(exporter.wait_failed())
        await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failing.cancel()
        failed = exporter.failed
    finally:
        await exporter.stop()
    if failed is not None:
        log.error("exporter_failed", error=repr(failed), exit_code=1)
        return False
    return True


def run(settings: Settings) -> int:
    logs.configure(
        settings.log_level, None if settings.log_format == "auto" else settings.log_format == "json"
    )
    log.info("effective_config", **dataclasses.asdict(settings))
    try:
        ok = asyncio.run(serve(settings))
    except ConfigError as e:
        log.error("exporter_not_started", error=str(e))
        return 2
    except OSError as e:
        log.error(
            "exporter_not_started",
            error=str(e),
            check=f"is {settings.listen_address}:{settings.port} free? (--port)",
        )
        return 1
    return 0 if ok else 1
