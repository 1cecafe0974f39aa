"""One registered device plugin as the kubelet sees it: a channel to its socket, its options, and
the device list kept current by a ListAndWatch stream consumed for as long as the plugin lives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import structlog
from grpc import aio

from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.sockets import HEALTHY, unix_target

log = structlog.get_logger(__name__)


@dataclass
class PluginEndpoint:
    """A plugin endpoint; ``devices`` (ID → health) is replaced on every stream message."""

    resource: str
    socket_path: str
    on_change: Callable[[PluginEndpoint], None]
    options: api_pb2.DevicePluginOptions = field(default_factory=api_pb2.DevicePluginOptions)
    devices: dict[str, str] = field(default_factory=dict)
    numa: dict[str, int] = field(default_factory=dict)
    """Device ID → its first NUMA node, -1 without topology."""
    connected: bool = False
    updates: int = 0
    _channel: aio.Channel | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def stub(self) -> api_pb2_grpc.DevicePluginAsyncStub:
        assert self._channel is not None, "endpoint not started"
        return api_pb2_grpc.DevicePluginStub(self._channel)

    def healthy(self) -> list[str]:
        return sorted(d for d, h in self.devices.items() if h == HEALTHY)

    async def start(self, timeout_s: float = 10.0) -> None:
        """Dial the plugin, read its options, and start following ListAndWatch."""
        self._channel = aio.insecure_channel(unix_target(self.socket_path))
        await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        self.options = await self.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout_s)
        self.connected = True
        self._task = asyncio.create_task(self._follow(), name=f"list-and-watch:{self.resource}")

    async def _follow(self) -> None:
        try:
            async for response in self.stub.ListAndWatch(api_pb2.Empty()):
                self.devices = {d.ID: d.health for d in response.devices}
                self.numa = {
                    d.ID: d.topology.nodes[0].ID if d.topology.nodes else -1
                    for d in response.devices
                }
                self.updates += 1
                log.debug(
                    "plugin_devices",
                    resource=self.resource,
                    total=len(self.devices),
                    healthy=len(self.healthy()),
                )
                self.on_change(self)
        except aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                log.info("list_and_watch_lost", resource=self.resource, code=e.code().name)
        finally:
            self.connected = False
            self.on_change(self)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        self.connected = False
