"""Hosting the plugins: serve each resource's socket, then register; again after a kubelet restart.

As NVIDIA's plugin does: one plugin per resource name, each on its own socket in the kubelet's
directory; when ``kubelet.sock`` is recreated (a kubelet restart removes our sockets too) every
plugin is restarted and registered again, without restarting the process. Sockets are removed
on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

import grpc
import structlog

from lj_runtimekit_interface import sockets

from .inventory import Inventory
from .resources import ResourceNames, advertise
from .server import (
    Allocator,
    DevicePlugin,
    Intent,
    Observer,
    create_server,
    register,
    socket_name,
)

log = structlog.get_logger(__name__)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns)


class PluginHost:
    """All plugins of this node, bound to one kubelet directory."""

    def __init__(
        self,
        plugin_dir: str,
        inventory: Inventory,
        names: ResourceNames,
        allocator: Allocator,
        *,
        observe: Observer | None = None,
        on_registered: Callable[[str], None] | None = None,
        intent: Intent | None = None,
    ) -> None:
        self.intent = intent
        self.plugin_dir = plugin_dir
        self.kubelet_socket = os.path.join(plugin_dir, sockets.KUBELET_SOCKET)
        self.inventory = inventory
        self.names = names
        self.allocator = allocator
        self.observe = observe
        self.on_registered = on_registered or (lambda _: None)
        self._servers: dict[str, grpc.aio.Server] = {}
        self.registered: set[str] = set()

    def resources(self) -> list[str]:
        return sorted(advertise(self.inventory.view().devices, self.names))

    async def start(self) -> None:
        """Serve every resource's socket, then register each with the kubelet."""
        await self.stop()
        for resource in self.resources():
            path = os.path.join(self.plugin_dir, socket_name(resource))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            plugin = DevicePlugin(
                resource,
                self.inventory,
                self.names,
                self.allocator,
                self.observe,
                intent=self.intent,
            )
            server = create_server(sockets.unix_target(path), plugin)
            await server.start()
            self._servers[resource] = server
            try:
                await register(self.kubelet_socket, plugin, socket_name(resource), 5.0)
            except grpc.aio.AioRpcError as e:
                log.warning(
                    "registration_failed",
                    resource=resource,
                    kubelet_socket=self.kubelet_socket,
                    error=f"{e.code().name} {e.details()}",
                    next="waiting for kubelet.sock to be recreated",
                )
                continue
            self.registered.add(resource)
            self.on_registered(resource)
            log.info("registered", resource=resource, endpoint=socket_name(resource))

    async def stop(self) -> None:
        for resource, server in self._servers.items():
            await server.stop(grace=1.0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.plugin_dir, socket_name(resource)))
        self._servers.clear()
        self.registered.clear()

    async def run(self, poll_s: float = 0.2) -> None:
        """Start; restart all plugins when kubelet.sock is recreated or resources change."""
        seen = _identity(self.kubelet_socket)
        await self.start()
        wanted = self.resources()
        try:
            while True:
                await asyncio.sleep(poll_s)
                now = _identity(self.kubelet_socket)
                resources = self.resources()
                if now != seen and now is not None:
                    log.info("kubelet_restarted", kubelet_socket=self.kubelet_socket)
                elif resources == wanted and (now is None or self.registered):
                    seen = now
                    continue
                seen, wanted = now, resources
                if now is not None:
                    await self.start()
        finally:
            await self.stop()
