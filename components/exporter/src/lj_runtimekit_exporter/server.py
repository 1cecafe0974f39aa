"""HTTP surface: ``/metrics`` (Prometheus text, or OpenMetrics when asked) and ``/healthz``.

A scrape renders the latest snapshot and nothing else: no Runtime, kubelet or apiserver call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from .collector import Exposition, SnapshotCollector, State
from .exposition import OPENMETRICS_TYPE, TEXT_TYPE, wants_openmetrics


def create_registry(state: State) -> CollectorRegistry:
    """A fresh registry holding only this exporter's collector (no global state).

    /metrics renders through :class:`Exposition` (same series, cached per snapshot); the registry
    is for embedding and for tests comparing the two renderings.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(state))
    return registry


def create_app(state: State, healthy: Callable[[], tuple[bool, str]]) -> web.Application:
    """The aiohttp application; ``healthy()`` says whether the poll loop is alive."""
    exposition = Exposition(state)

    async def metrics(request: web.Request) -> web.Response:
        started = time.perf_counter()
        openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
        body = exposition.body(openmetrics)
        state.stats.scrapes += 1
        state.stats.last_scrape_seconds = time.perf_counter() - started
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = OPENMETRICS_TYPE if openmetrics else TEXT_TYPE
        return resp

    async def healthz(request: web.Request) -> web.Response:
        ok, why = healthy()
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app``; returns the runner (``await runner.cleanup()`` to stop) and the bound port."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    address = runner.addresses[0]
    return runner, int(address[1])
