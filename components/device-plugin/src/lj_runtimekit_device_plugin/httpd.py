"""``/metrics`` and ``/healthz`` over HTTP (aiohttp)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .metrics import PluginMetrics


def create_app(metrics: PluginMetrics, healthy: Callable[[], tuple[bool, str]]) -> web.Application:
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
