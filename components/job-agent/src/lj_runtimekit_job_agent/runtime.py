"""The only module that talks to the Runtime: its ConfigService on ``config-daemon.sock``, and
DeviceService on ``device-daemon.sock`` (GetVersion: which Runtime, which driver; ListDevices and
ListAllocations for the ``partition`` action), converted to plain data (:mod:`.gpus`) here."""

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

from . import gpus, runtime_channel
from .errors import PermanentError, TemporaryError


class RuntimeUnavailable(TemporaryError):
    """The config daemon's socket is absent or does not answer."""


class RuntimeRefused(PermanentError):
    """The config daemon answered with an error that retrying will not fix."""


class RuntimeBusy(RuntimeRefused):
    """The Runtime refused a change with FAILED_PRECONDITION (a live allocation on the device)."""


class MethodMissing(RuntimeRefused):
    """The Runtime answered UNIMPLEMENTED: it is older than the method."""


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


def _error(code: grpc.StatusCode, text: str) -> Exception:
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return RuntimeUnavailable(text)
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return RuntimeBusy(text)
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return MethodMissing(text)
    return RuntimeRefused(text)


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
        return _error(code, text)

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

    async def set_partitioning(
        self,
        device_id: str,
        mode: str,
        profiles: tuple[str, ...] = (),
        slices: tuple[int, ...] = (),
    ) -> tuple[str, ...]:
        """SetPartitioning of one device: ``mig`` profiles, ``tdm`` slice percents, or neither
        (``whole``: partitioning removed); returns the resulting partition ids. Idempotent."""
        request = config_pb2.SetPartitioningRequest(device_id=device_id)
        if mode == "mig":
            request.mig.CopyFrom(config_pb2.MigSpec(profiles=list(profiles)))
        elif mode == "tdm":
            request.tdm.CopyFrom(config_pb2.TdmSpec(slice_percents=list(slices)))
        try:
            reply = await self._stub().SetPartitioning(
                request, timeout=self.timeout, wait_for_ready=True
            )
        except aio.AioRpcError as e:
            raise self._error("SetPartitioning", e) from e
        return tuple(reply.partition_ids)

    async def set_binding(self, device_id: str, binding: str) -> bool:
        """SetDeviceBinding of one device to ``driver`` or ``vfio``; whether it changed."""
        wanted = (
            device_pb2.DEVICE_BINDING_VFIO
            if binding == gpus.VFIO
            else device_pb2.DEVICE_BINDING_DRIVER
        )
        try:
            reply = await self._stub().SetDeviceBinding(
                config_pb2.SetDeviceBindingRequest(device_id=device_id, binding=wanted),
                timeout=self.timeout,
                wait_for_ready=True,
            )
        except aio.AioRpcError as e:
            raise self._error("SetDeviceBinding", e) from e
        return reply.changed

    async def has_set_device_binding(self) -> bool:
        """Whether the Runtime has SetDeviceBinding, asked with a request the interface refuses
        (binding UNSPECIFIED: INVALID_ARGUMENT) so that nothing changes: only a Runtime without
        the method answers UNIMPLEMENTED."""
        try:
            await self._stub().SetDeviceBinding(
                config_pb2.SetDeviceBindingRequest(
                    device_id="", binding=device_pb2.DEVICE_BINDING_UNSPECIFIED
                ),
                timeout=self.timeout,
                wait_for_ready=True,
            )
        except aio.AioRpcError as e:
            error = self._error("SetDeviceBinding", e)
            if isinstance(error, MethodMissing):
                return False
            if isinstance(error, RuntimeUnavailable):
                raise error from e
        return True


def _gpu(d: device_pb2.Device) -> gpus.Gpu:
    binding = runtime_channel.enum_name(device_pb2.DeviceBinding, d.binding, "DEVICE_BINDING_")
    mode = runtime_channel.enum_name(device_pb2.PartitionMode, d.partition_mode, "PARTITION_MODE_")
    if mode == "unspecified" and not d.partitions:
        mode = "none"
    supported = (
        runtime_channel.enum_name(device_pb2.PartitionMode, m, "PARTITION_MODE_")
        for m in d.supported_partition_modes
    )
    return gpus.Gpu(
        id=d.id,
        index=d.index,
        memory_bytes=d.memory_bytes,
        # UNSPECIFIED: a Runtime older than Device.binding, whose devices are the driver's
        binding=gpus.DRIVER if binding == "unspecified" else binding,
        mode=mode,
        profiles=tuple(p.profile for p in d.partitions) if mode == "mig" else (),
        slices=tuple(p.time_percent for p in d.partitions) if mode == "tdm" else (),
        partition_ids=tuple(p.id for p in d.partitions),
        supported_modes=frozenset(m for m in supported if m in ("mig", "tdm")),
    )


class DeviceDaemon:
    """A client of DeviceService for ListDevices and ListAllocations; ``async with``."""

    def __init__(self, socket_dir: str, timeout: float) -> None:
        self.path = runtime_channel.socket_path(socket_dir, sockets.DEVICE_SOCKET)
        self.timeout = timeout
        self._channel: aio.Channel | None = None
        self._stub: device_pb2_grpc.DeviceServiceAsyncStub | None = None

    async def __aenter__(self) -> DeviceDaemon:
        if not await asyncio.to_thread(os.path.exists, self.path):
            raise RuntimeUnavailable(
                f"Runtime socket {self.path} not found: is the Runtime's device daemon running "
                "on this node, and is its socket directory mounted into the agent's pod?"
            )
        self._channel = runtime_channel.open_channel(self.path)
        self._stub = device_pb2_grpc.DeviceServiceStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()

    def _device(self) -> device_pb2_grpc.DeviceServiceAsyncStub:
        assert self._stub is not None, "use DeviceDaemon with async with"
        return self._stub

    def _error(self, method: str, e: aio.AioRpcError) -> Exception:
        code = e.code()
        return _error(
            code, f"device daemon {self.path}: {method} failed: {code.name}: {e.details()}"
        )

    async def list_gpus(self) -> list[gpus.Gpu]:
        """The node's GPUs (devices of kind GPU), by index."""
        try:
            reply = await self._device().ListDevices(
                device_pb2.ListDevicesRequest(), timeout=self.timeout, wait_for_ready=True
            )
        except aio.AioRpcError as e:
            raise self._error("ListDevices", e) from e
        if reply is None:  # grpc-aio's answer to bytes that do not parse
            raise RuntimeRefused(f"device daemon {self.path}: ListDevices answered garbage")
        found = [_gpu(d) for d in reply.devices if d.kind == device_pb2.DEVICE_KIND_GPU]
        return sorted(found, key=lambda g: g.index)

    async def list_holdings(self) -> list[gpus.Holding]:
        """The node's live allocations."""
        try:
            reply = await self._device().ListAllocations(
                device_pb2.ListAllocationsRequest(), timeout=self.timeout, wait_for_ready=True
            )
        except aio.AioRpcError as e:
            raise self._error("ListAllocations", e) from e
        if reply is None:
            raise RuntimeRefused(f"device daemon {self.path}: ListAllocations answered garbage")
        return [
            gpus.Holding(a.id, a.pod.namespace, a.pod.name, a.container, tuple(a.device_ids))
            for a in reply.allocations
        ]
