"""HTTP surface: ``/metrics`` (Prometheus) and ``/healthz``."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import Metrics


def create_app(
    metrics: Metrics,
    healthy: Callable[[], str | None],
    degraded: Callable[[], list[str]] = list,
) -> web.Application:
    """``healthy()`` returns None when healthy, else what is wrong (503); ``degraded()`` what
    does not work now although the operator keeps serving (200, one line each)."""

    async def metrics_view(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        problem = healthy()
        if problem is None:
            return web.Response(text="ok\n" + "".join(f"degraded: {p}\n" for p in degraded()))
        return web.Response(status=503, text=problem + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    return app


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    return runner, sockets[0].getsockname()[1] if sockets else port


async def add_site(runner: web.AppRunner, host: str, port: int) -> None:
    """Serve the same application on one more address (the health-probe bind address)."""
    await web.TCPSite(runner, host, port).start()
