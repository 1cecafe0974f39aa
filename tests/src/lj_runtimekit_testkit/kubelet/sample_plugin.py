"""A tiny device plugin for testing the emulator (and anything else that plays kubelet): it
serves the DevicePlugin API on its own socket, registers with ``kubelet.sock``, and registers
again when the kubelet socket is recreated, as real plugins do."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.sockets import (
    DEVICE_PLUGIN_API_VERSION,
    HEALTHY,
    KUBELET_SOCKET,
    UNHEALTHY,
    unix_target,
)


class SampleDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """``count`` devices ``<prefix>-<i>`` of ``resource``; calls are recorded for assertions."""

    def __init__(
        self,
        plugin_dir: str,
        resource: str = "example.com/dev",
        count: int = 4,
        *,
        endpoint: str = "sample.sock",
        preferred: bool = False,
        pre_start: bool = False,
        version: str = DEVICE_PLUGIN_API_VERSION,
    ) -> None:
        self.plugin_dir, self.resource, self.endpoint = plugin_dir, resource, endpoint
        self.version = version
        self.options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=preferred
        )
        prefix = resource.rsplit("/", 1)[-1]
        self.health = {f"{prefix}-{i}": HEALTHY for i in range(count)}
        self.allocate_calls: list[list[str]] = []
        self.preferred_calls: list[tuple[list[str], int]] = []
        self.pre_start_calls: list[list[str]] = []
        self.registrations = 0
        self.allocate_delay_s = 0.0
        """Seconds each Allocate takes (to observe what the kubelet shows meanwhile)."""
        self._changed = asyncio.Event()
        self._server: aio.Server | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, self.endpoint)

    def set_health(self, device_id: str, healthy: bool) -> None:
        self.health[device_id] = HEALTHY if healthy else UNHEALTHY
        self._changed.set()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        while True:
            self._changed.clear()
            yield api_pb2.ListAndWatchResponse(
                devices=[api_pb2.Device(ID=d, health=h) for d, h in self.health.items()]
            )
            await self._changed.wait()

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: aio.ServicerContext[object, object],
    ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            available = list(req.available_deviceIDs)
            self.preferred_calls.append((available, req.allocation_size))
            # Prefer the highest IDs, so a test can tell the preference was used.
            chosen = sorted(available, reverse=True)[: req.allocation_size]
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        responses = []
        if self.allocate_delay_s:
            await asyncio.sleep(self.allocate_delay_s)
        for req in request.container_requests:
            ids = list(req.devices_ids)
            self.allocate_calls.append(ids)
            unknown = [d for d in ids if d not in self.health]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            responses.append(
                api_pb2.ContainerAllocateResponse(envs={"SAMPLE_DEVICES": ",".join(ids)})
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: aio.ServicerContext[object, object],
    ) -> api_pb2.PreStartContainerResponse:
        self.pre_start_calls.append(list(request.devices_ids))
        return api_pb2.PreStartContainerResponse()

    async def start(self) -> None:
        """Serve, register, and keep re-registering whenever kubelet.sock is recreated."""
        await self._serve()
        try:
            await self.register()
        except BaseException:
            await self.stop()
            raise
        self._watch = asyncio.create_task(self._watch_kubelet(), name="sample-plugin-watch")

    async def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server

    async def register(self) -> None:
        kubelet = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        async with aio.insecure_channel(unix_target(kubelet)) as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=self.version,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=self.options,
                ),
                timeout=10,
            )
        self.registrations += 1

    async def _watch_kubelet(self) -> None:
        kubelet = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        seen = _inode(kubelet)
        while True:
            await asyncio.sleep(0.05)
            now = _inode(kubelet)
            if now is not None and now != seen:
                # The kubelet restarted: it removed our socket too. Serve again and register.
                if self._server is not None:
                    await self._server.stop(grace=None)
                await self._serve()
                await self.register()
            seen = now

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


def _inode(path: str) -> tuple[int, int] | None:
    """Identity of a socket file: inode numbers are reused, so the change time goes with it."""
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_ctime_ns)
    except FileNotFoundError:
        return None
