"""HTTP surface: ``/metrics`` (Prometheus) and ``/healthz``."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import Metrics


def create_app(
    metrics: Metrics, healthy: Callable[[], bool], degraded: Callable[[], list[str]] = list
) -> web.Application:
    """``degraded()``: what does not work now although the scheduler still serves (200)."""

    async def metrics_handler(request: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        if not healthy():
            return web.Response(status=503, text="not serving")
        problems = degraded()
        return web.Response(text="ok" + "".join(f"\ndegraded: {p}" for p in problems))

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    return app


async def create_server(
    metrics: Metrics,
    healthy: Callable[[], bool],
    host: str,
    port: int,
    degraded: Callable[[], list[str]] = list,
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (to stop it) and the bound port (for port 0)."""
    runner = web.AppRunner(create_app(metrics, healthy, degraded), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


async def add_site(runner: web.AppRunner, host: str, port: int) -> None:
    """Serve the same application on one more address (the health-probe bind address)."""
    await web.TCPSite(runner, host, port).start()
