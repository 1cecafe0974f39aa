"""HTTP surface: ``/metrics`` (Prometheus text, or OpenMetrics when asked) and ``/healthz``.

A scrape renders the latest snapshot and nothing else: no Runtime, kubelet or apiserver call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from .collector import Exposition, State
from .exposition import OPENMETRICS_TYPE, TEXT_TYPE, wants_openmetrics


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


async def add_site(runner: web.AppRunner, host: str, port: int) -> None:
    """Serve the same application on one more address (the health-probe bind address)."""
    await web.TCPSite(runner, host, port).start()
