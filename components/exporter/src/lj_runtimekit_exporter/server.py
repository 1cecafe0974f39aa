"""HTTP surface: ``/metrics`` (Prometheus text, or OpenMetrics when asked) and ``/healthz``.

A scrape renders the latest snapshot and nothing else: no Runtime, kubelet or apiserver call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .collector import SnapshotCollector, State


def create_registry(state: State) -> CollectorRegistry:
    """A fresh registry holding only this exporter's collector (no global state)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(state))
    return registry


def create_app(state: State, healthy: Callable[[], tuple[bool, str]]) -> web.Application:
    """The aiohttp application; ``healthy()`` says whether the poll loop is alive."""
    registry = create_registry(state)

    async def metrics(request: web.Request) -> web.Response:
        started = time.perf_counter()
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        state.stats.scrapes += 1
        state.stats.last_scrape_seconds = time.perf_counter() - started
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
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
