"""The only module that talks to the Runtime: its ConfigService on ``config-daemon.sock``, and
DeviceService.GetVersion on ``device-daemon.sock`` (which Runtime, which driver)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import grpc
from grpc import aio

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import (
    config_pb2,
    config_pb2_grpc,
    device_pb2,
    device_pb2_grpc,
)

from . import runtime_channel
from .errors import PermanentError, TemporaryError


class RuntimeUnavailable(TemporaryError):
    """The config daemon's socket is absent or does not answer."""


class RuntimeRefused(PermanentError):
    """The config daemon answered with an error that retrying will not fix."""


@dataclass(frozen=True)
class FeatureState:
    """The node's Runtime Kit state, converted once from GetFeatureStateResponse."""

    enabled: bool
    features: dict[str, bool]
    runtime_version: str


def _state(msg: config_pb2.GetFeatureStateResponse) -> FeatureState:
    return FeatureState(
        enabled=msg.enabled,
        features={f.name: f.enabled for f in msg.features},
        runtime_version=msg.runtime_version,
    )


@dataclass(frozen=True)
class RuntimeVersion:
    """What DeviceService.GetVersion said; ``driver_version`` empty from a Runtime before it."""

    version: str
    api_version: str
    driver_version: str
    capabilities: frozenset[str]


class VersionUnknown(TemporaryError):
    """GetVersion could not be asked (device socket absent, not answering, or no such method)."""


async def get_version(socket_dir: str, rpc_timeout: float) -> RuntimeVersion:
    """Ask the Runtime's DeviceService which version it is; :class:`VersionUnknown` if it can't
    be asked (the caller decides what an unknown version allows)."""
    path = runtime_channel.socket_path(socket_dir, sockets.DEVICE_SOCKET)
    if not await asyncio.to_thread(os.path.exists, path):
        raise VersionUnknown(f"Runtime socket {path} not found: cannot ask GetVersion")
    channel = runtime_channel.open_channel(path)
    try:
        stub = device_pb2_grpc.DeviceServiceStub(channel)
        reply = await stub.GetVersion(device_pb2.GetVersionRequest(), timeout=rpc_timeout)
    except aio.AioRpcError as e:
        raise VersionUnknown(
            f"device daemon {path}: GetVersion failed: {e.code().name}: {e.details()}"
        ) from e
    finally:
        await channel.close()
    if reply is None:  # grpc-aio's answer to bytes that do not parse
        raise VersionUnknown(f"device daemon {path}: GetVersion answered an unreadable reply")
    return RuntimeVersion(
        reply.version, reply.api_version, reply.driver_version, frozenset(reply.capabilities)
    )


class ConfigDaemon:
    """A client of ConfigService; ``async with`` opens and closes its channel."""

    def __init__(self, socket_dir: str, timeout: float) -> None:
        self.path = runtime_channel.socket_path(socket_dir, sockets.CONFIG_SOCKET)
        self.timeout = timeout
        self._channel: aio.Channel | None = None
        self._config: config_pb2_grpc.ConfigServiceAsyncStub | None = None

    async def __aenter__(self) -> ConfigDaemon:
        if not await asyncio.to_thread(os.path.exists, self.path):
            raise RuntimeUnavailable(
                f"Runtime socket {self.path} not found: is the Runtime's config daemon running "
                "on this node, and is its socket directory mounted into the agent's pod?"
            )
        # The guide's reconnect backoff (1 s, x2, 30 s at most): a config daemon restarting
        # while a call waits for it (wait_for_ready) is found again within the call's timeout.
        self._channel = runtime_channel.open_channel(self.path)
        self._config = config_pb2_grpc.ConfigServiceStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()

    def _stub(self) -> config_pb2_grpc.ConfigServiceAsyncStub:
        assert self._config is not None, "use ConfigDaemon with async with"
        return self._config

    def _error(self, method: str, e: aio.AioRpcError) -> Exception:
        code = e.code()
        text = f"config daemon {self.path}: {method} failed: {code.name}: {e.details()}"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return RuntimeUnavailable(text)
        return RuntimeRefused(text)

    async def state(self) -> FeatureState:
        try:
            reply = await self._stub().GetFeatureState(
                config_pb2.GetFeatureStateRequest(), timeout=self.timeout, wait_for_ready=True
            )
        except aio.AioRpcError as e:
            raise self._error("GetFeatureState", e) from e
        return _state(reply)

    async def set_enabled(self, enabled: bool) -> tuple[bool, FeatureState]:
        """Switch every feature; returns (changed, resulting state). Idempotent."""
        try:
            reply = await self._stub().SetFeatures(
                config_pb2.SetFeaturesRequest(enabled=enabled),
                timeout=self.timeout,
                wait_for_ready=True,
            )
        except aio.AioRpcError as e:
            raise self._error("SetFeatures", e) from e
        return reply.changed, _state(reply.state)
