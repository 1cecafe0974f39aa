"""The kubelet's read-only port: ``GET /pods`` answers a PodList of the pods on this node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

PodSource = Callable[[], list[dict[str, Any]]]


def create_app(pods: PodSource) -> web.Application:
    async def list_pods(_: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods()}
        )

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/pods", list_pods)
    app.router.add_get("/pods/", list_pods)
    app.router.add_get("/healthz", healthz)
    return app


class PodsServer:
    """Serves :func:`create_app` on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, pods: PodSource, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runner = web.AppRunner(create_app(pods), access_log=None)
        self._host, self._port = host, port
        self.url = ""

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        port = sockets[0].getsockname()[1] if sockets else self._port
        self.url = f"http://{self._host}:{port}/pods"

    async def stop(self) -> None:
        await self._runner.cleanup()
