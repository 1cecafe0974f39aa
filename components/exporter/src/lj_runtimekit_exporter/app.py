"""Lifecycle of the exporter: the poll task and the HTTP server, signals, ordered shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

import structlog
from aiohttp import web

from . import lifecycle, logs, server
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

    def __init__(self, settings: Settings, tasks: lifecycle.Tasks | None = None) -> None:
        self.settings = settings
        self.tasks = tasks if tasks is not None else lifecycle.Tasks()
        """The poll task runs here; a signal or its failure sets ``tasks.stop``."""
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
    def failed(self) -> str | None:
        """Why the poll loop ended, if it ended on an error."""
        return self.tasks.fatal or None

    async def start(self) -> None:
        if self.pods is not None:
            await self.pods.start()
        if self.pod_resources is not None:
            await self.pod_resources.start()
        self._poll_task = self.tasks.spawn("poll", self.poller.run(self.tasks.stop))
        app = server.create_app(self.state, self.healthy)
        host, port = self.settings.metrics_address
        self._runner, self.port = await server.start(app, host, port)
        if self.settings.probe_address is not None:
            # the probe address serves the same routes: kubelet probes reach /healthz there
            await server.add_site(self._runner, *self.settings.probe_address)
        log.info("exporter_serving", address=host, port=self.port)

    async def stop(self) -> None:
        self.tasks.stop.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._poll_task is not None:
            try:
                await asyncio.wait_for(self._poll_task, 5.0)
            except TimeoutError:
                await self.tasks.cancel()
        if self.pods is not None:
            await self.pods.stop()
        if self.pod_resources is not None:
            await self.pod_resources.stop()
        await self.runtime.close()


async def serve(settings: Settings, tasks: lifecycle.Tasks) -> None:
    """Serve until a signal or until the poll loop fails (``tasks.fatal`` says which)."""
    exporter = Exporter(settings, tasks)
    try:
        await exporter.start()
        await tasks.wait()
    finally:
        await exporter.stop()


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """Exit 0 after a signal, 1 when the poll loop fails or the port is taken, 2 for a setting
    found wrong only at start (a kubeconfig that does not load); a second signal exits 130."""
    logs.configure(settings.log_level, settings.log_format)
    for note in deprecations:
        log.warning("deprecated_setting", note=note)
    log.info("effective_config", **dataclasses.asdict(settings))

    async def main(tasks: lifecycle.Tasks) -> None:
        await serve(settings, tasks)

    try:
        return lifecycle.run(main, name="exporter")
    except ConfigError as e:
        log.error("exporter_not_started", error=str(e), exit_code=lifecycle.EXIT_USAGE)
        return lifecycle.EXIT_USAGE
    except OSError as e:
        log.error(
            "exporter_not_started",
            error=str(e),
            check=f"is {settings.metrics_bind_address} free? (--metrics-bind-address)",
            exit_code=lifecycle.EXIT_FAILED,
        )
        return lifecycle.EXIT_FAILED
