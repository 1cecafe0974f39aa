"""Lifecycle of the device plugin: named tasks, signals, ordered shutdown.

The node core (:mod:`.node`) is built, the mode chosen once (:func:`.modes.choose`), both run
until a signal or a failed task, then stop in order: the tasks, the mode's sockets, the HTTP
server, the core's clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import __version__, lifecycle, logs, modes, node
from .metrics import PluginMetrics
from .settings import Settings

log = structlog.get_logger(__name__)


def create_app(metrics: PluginMetrics, healthy: Callable[[], tuple[bool, str]]) -> web.Application:
    """``/metrics`` and ``/healthz`` over HTTP."""

    async def get_metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def get_healthz(_: web.Request) -> web.Response:
        ok, why = healthy()
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)
    return app


async def _http(
    s: Settings,
    metrics: PluginMetrics,
    healthy: Callable[[], tuple[bool, str]],
    bound: Callable[[int], None] | None,
) -> web.AppRunner:
    """/metrics and /healthz on the metrics address (and the probe address)."""
    runner = web.AppRunner(create_app(metrics, healthy))
    await runner.setup()
    await web.TCPSite(runner, *s.metrics_address).start()
    if s.probe_address is not None:
        # the probe address serves the same routes: kubelet probes reach /healthz there
        await web.TCPSite(runner, *s.probe_address).start()
    if bound is not None:
        bound(int(runner.addresses[0][1]))  # the real port when the bind address asks for 0
    return runner


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
    metrics = PluginMetrics()
    parts = await node.connect(s, metrics)
    mode = modes.choose(parts)
    core = node.build(parts, mode.reclaiming)

    def healthy() -> tuple[bool, str]:
        return core.health(*mode.registration())

    runner = await _http(s, metrics, healthy, bound)
    core.spawn(tasks)
    await mode.start(core, tasks)
    await tasks.wait()
    log.info("shutting_down")
    await tasks.cancel()
    await mode.stop()
    await runner.cleanup()
    await core.close()


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """Serve until a signal (exit 0) or a fatal error (exit 1, never 0: a pod that ended on an
    error must not read "Completed" in CrashLoopBackOff); a second signal exits 130 at once."""
    logs.configure(settings.log_level, settings.log_format)
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
