"""The simulator's fault control over HTTP on ``<socket dir>/control.sock``, for other processes.

    curl --unix-socket DIR/control.sock localhost/state
    curl --unix-socket DIR/control.sock localhost/health -d '{"device":"gpu-3","healthy":false,
         "reason":"XID 79"}'
    curl --unix-socket DIR/control.sock localhost/fail -d '{"method":"Allocate",
         "code":"UNAVAILABLE", "delay_s": 0}'
    curl --unix-socket DIR/control.sock -X POST localhost/restart

Every POST answers ``{"ok": true}`` or a 400 with ``{"error": "..."}``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from lj_runtimekit_testkit.simulator.simulator import Simulator

CONTROL_SOCKET = "control.sock"


def _services(body: dict[str, Any]) -> list[str] | None:
    services = body.get("services")
    if services is None:
        return None
    if not isinstance(services, list) or not all(isinstance(s, str) for s in services):
        raise ValueError("services: expected a list of service names")
    return services


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class ControlServer:
    """aiohttp on a unix socket; each route is one fault switch of the Simulator."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.path = sim.socket_dir / CONTROL_SOCKET
        self._runner: web.AppRunner | None = None

    def _app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/state", self._state),
                web.post("/health", self._action(self._health)),
                web.post("/fail", self._action(self._fail)),
                web.post("/restart", self._action(self._restart)),
                web.post("/stop", self._action(self._stop)),
                web.post("/start", self._action(self._start)),
            ]
        )
        return app

    async def start(self) -> None:
        _remove(self.path)
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.path)).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        _remove(self.path)

    @staticmethod
    def _action(
        handler: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def route(request: web.Request) -> web.Response:
            try:
                text = await request.text()
                doc = json.loads(text) if text.strip() else {}
                if not isinstance(doc, dict):
                    raise ValueError("body: expected a JSON object")
                await handler(doc)
            except (ValueError, KeyError, TypeError) as e:
                return web.json_response({"ok": False, "error": str(e)}, status=400)
            return web.json_response({"ok": True})

        return route

    async def _state(self, request: web.Request) -> web.Response:
        sim = self.sim
        return web.json_response(
            {
                "node": sim.node.node,
                "running": sim.running,
                "devices": {
                    d.id: {
                        "healthy": d.health.healthy,
                        "reason": d.health.reason,
                        "mode": d.mode.value,
                        "partitions": [p.id for p in d.partitions],
                        "binding": d.binding.value,
                    }
                    for d in sim.devices()
                },
                "allocations": [
                    {
                        "id": a.id,
                        "pod": f"{a.pod.namespace}/{a.pod.name}",
                        "container": a.container,
                        "devices": list(a.device_ids),
                        "core_percent": a.core_percent,
                        "memory_bytes": a.memory_bytes,
                    }
                    for a in sim.allocations()
                ],
                "faults": {
                    m: {"code": c.name if c else None, "delay_s": d}
                    for m, (c, d) in sim.faults.failures.items()
                },
                "capabilities": list(sim.faults.capabilities),
            }
        )

    async def _health(self, body: dict[str, Any]) -> None:
        healthy = body.get("healthy")
        if not isinstance(healthy, bool):
            raise ValueError("healthy: expected true or false")
        self.sim.set_health(str(body["device"]), healthy, str(body.get("reason", "")))

    async def _fail(self, body: dict[str, Any]) -> None:
        code_name = body.get("code")
        code = None
        if code_name is not None:
            if (
                not isinstance(code_name, str)
                or code_name.upper() not in grpc.StatusCode.__members__
            ):
                raise ValueError(f"code: expected a gRPC status name, got {code_name!r}")
            code = grpc.StatusCode[code_name.upper()]
        delay = body.get("delay_s", 0.0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ValueError("delay_s: expected a number >= 0")
        self.sim.fail(str(body["method"]), code, float(delay))

    async def _restart(self, body: dict[str, Any]) -> None:
        await self.sim.restart(_services(body))

    async def _stop(self, body: dict[str, Any]) -> None:
        await self.sim.stop(_services(body))

    async def _start(self, body: dict[str, Any]) -> None:
        await self.sim.start(_services(body))
