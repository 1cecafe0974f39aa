"""Hosting the plugins: serve each resource's socket, then register; again after a kubelet restart.

As NVIDIA's plugin does: one plugin per resource name, each on its own socket in the kubelet's
directory; when ``kubelet.sock`` is recreated (a kubelet restart removes our sockets too) every
plugin is restarted and registered again, without restarting the process. A resource that
appears or disappears while the plugin runs (GPUs bound to or from vfio-pci, the last device of a
kind gone) starts or stops its own plugin alone. Sockets are removed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

import grpc
import structlog

from lj_runtimekit_interface import sockets

from .. import runtime_channel
from ..handover import Handover
from ..inventory import Inventory
from ..resources import ResourceNames, advertise
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


def backoff_s(failures: int) -> float:
    """The guide's backoff before retry ``failures`` + 1: 1 s, x2, at most 30 s."""
    return max(runtime_channel.BACKOFF_INITIAL_S, runtime_channel.backoff_s(failures))


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
        on_refused: Callable[[str], None] | None = None,
        intent: Intent | None = None,
        withheld: Handover | None = None,
    ) -> None:
        self.withheld = withheld
        """The devices prepared DRA claims still hold (a node moved back from DRA), if any."""
        self.on_refused = on_refused or (lambda _: None)
        self.intent = intent
        self.plugin_dir = plugin_dir
        self.kubelet_socket = os.path.join(plugin_dir, sockets.KUBELET_SOCKET)
        self.inventory = inventory
        self.names = names
        self.allocator = allocator
        self.observe = observe
        self.on_registered = on_registered or (lambda _: None)
        self._servers: dict[str, grpc.aio.Server] = {}
        self._plugins: dict[str, DevicePlugin] = {}
        self.registered: set[str] = set()
        self.unregistered: dict[str, str] = {}
        """Resources served but not registered, with the kubelet's reason; retried by run()."""
        self._failures = 0

    def resources(self) -> list[str]:
        return sorted(advertise(self.inventory.view().devices, self.names))

    def serving(self) -> list[str]:
        """The resources whose plugins serve now, sorted as :meth:`resources`."""
        return sorted(self._servers)

    def registration_state(self) -> dict[str, bool]:
        """Each resource this host serves: registered with the kubelet now or not."""
        return {r: r in self.registered for r in self._servers}

    async def start(self) -> None:
        """Serve every resource's socket, then register each with the kubelet."""
        await self.stop()
        for resource in self.resources():
            await self._start_one(resource)

    async def converge(self, resources: list[str]) -> None:
        """Serve and register the resources that appeared, stop those that are gone; the others
        keep their sockets and streams (binding one GPU to vfio-pci must not make the kubelet
        see every other resource's plugin drop and come back)."""
        for resource in sorted(set(self._servers) - set(resources)):
            await self._stop_one(resource)
            log.info("resource_withdrawn", resource=resource)
        for resource in resources:
            if resource not in self._servers:
                await self._start_one(resource)

    async def _start_one(self, resource: str) -> None:
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
            withheld=self.withheld,
        )
        server = create_server(sockets.unix_target(path), plugin)
        await server.start()
        self._servers[resource] = server
        self._plugins[resource] = plugin
        await self._register(resource)

    async def _stop_one(self, resource: str) -> None:
        server = self._servers.pop(resource)
        self._plugins.pop(resource, None)
        await server.stop(grace=1.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.plugin_dir, socket_name(resource)))
        self.registered.discard(resource)
        self.unregistered.pop(resource, None)

    async def _register(self, resource: str) -> bool:
        plugin = self._plugins[resource]
        try:
            await register(self.kubelet_socket, plugin, socket_name(resource), 5.0)
        except grpc.aio.AioRpcError as e:
            why = f"{e.code().name} {e.details()}"
            self.unregistered[resource] = why
            self.on_refused(resource)
            log.warning(
                "registration_failed",
                resource=resource,
                kubelet_socket=self.kubelet_socket,
                error=why,
                next="retrying with backoff (1 s, x2, 30 s max), and at once when kubelet.sock "
                "is recreated",
            )
            return False
        self.unregistered.pop(resource, None)
        self.registered.add(resource)
        self.on_registered(resource)
        log.info("registered", resource=resource, endpoint=socket_name(resource))
        return True

    async def retry_refused(self) -> None:
        """Register again each resource the kubelet refused (its socket still serves)."""
        for resource in sorted(self.unregistered):
            if resource in self._servers:
                await self._register(resource)

    async def stop(self) -> None:
        for resource in list(self._servers):
            await self._stop_one(resource)

    async def run(self, poll_s: float = 0.2) -> None:
        """Start; restart all plugins when kubelet.sock is recreated; start or stop single
        plugins when resources appear or disappear (a GPU bound to or from vfio-pci)."""
        seen = _identity(self.kubelet_socket)
        await self.start()
        # what start() served, not a fresh look: a resource that appeared while it registered
        # (a GPU bound to vfio-pci meanwhile) is then a change, seen at the next poll
        wanted = self.serving()
        loop = asyncio.get_running_loop()
        retry_at = loop.time()
        try:
            while True:
                await asyncio.sleep(poll_s)
                now = _identity(self.kubelet_socket)
                resources = self.resources()
                if now != seen and now is not None:
                    log.info("kubelet_restarted", kubelet_socket=self.kubelet_socket)
                elif resources != wanted:
                    log.info("resources_changed", before=wanted, after=resources)
                    seen, wanted = now, resources
                    if now is not None:  # else all start when the kubelet is back
                        await self.converge(resources)
                        wanted = self.serving()
                    continue
                elif now is None or self.registered or self.unregistered:
                    seen = now
                    # a refusal while others registered: no kubelet restart would come to retry it
                    if now is not None and self.unregistered and loop.time() >= retry_at:
                        await self.retry_refused()
                        self._failures = self._failures + 1 if self.unregistered else 0
                        retry_at = loop.time() + backoff_s(self._failures)
                    continue
                seen, wanted = now, resources
                self._failures = 0
                if now is not None:
                    await self.start()
                    wanted = self.serving()
                    retry_at = loop.time() + backoff_s(1)
        finally:
            await self.stop()
