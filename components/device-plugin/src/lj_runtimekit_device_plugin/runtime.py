"""The only module that talks to the Runtime: DeviceService over its unix socket.

Protobuf messages become :mod:`model` data here, once (:mod:`runtime_messages`), and only what
:mod:`domains` believes of them goes on. The channel, the call conventions and the enum decoding
are the shared shape of :mod:`.runtime_channel`; reconnects of the watch follow the guide's backoff
(1 s, x2, 30 s max) through tenacity. An older Runtime that lacks WatchDevices (absent from
GetVersion's capabilities, or UNIMPLEMENTED) degrades to the periodic check with one clear log.

The calls a kubelet waits on (``wait_for_ready``: Allocate, ListAllocations, Release,
UpdateAllocationOwner) first make sure the socket takes connections (:meth:`RuntimeClient.ready`):
a Runtime that is down fails them at once naming the socket, a restarting one is waited for
within the deadline (the rule is :mod:`liveness`'). They go on a channel of their own that redials
a Runtime that went away within a second (:data:`WAITED_RECONNECT_MAX_S`), so one that restarts
under a call pending in gRPC is reached within the deadline too; gRPC resends only calls that
never reached the Runtime's handler, so nothing is allocated twice.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc

from .domains import Screening
from .errors import PermanentError, TemporaryError
from .liveness import RESTART_GRACE_S, Liveness
from .model import Allocation, Device, RuntimeInfo
from .runtime_channel import (
    BACKOFF_FACTOR,
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    enum_name,
    open_channel,
)
from .runtime_messages import allocation_from_proto, device_from_proto, health_from_proto

log = structlog.get_logger(__name__)
T = TypeVar("T")

__all__ = ["allocation_from_proto", "device_from_proto", "health_from_proto"]

WATCH_DEVICES = "DeviceService.WatchDevices"
UPDATE_OWNER = "DeviceService.UpdateAllocationOwner"
#: How often a call waiting for a restarting Runtime looks at its socket.
SOCKET_POLL_S = 0.02
#: The channel of the calls a kubelet waits on redials a Runtime that went away at most this far
#: apart (from 0.1 s): a call pending while the Runtime restarts reaches it within about a second
#: of its return, not after gRPC's next backoff step (1, 2, 4 ... s of the shared channel, longer
#: than the deadline of a call that started just before the restart). The daemon's own reconnect
#: loops keep the guide's backoff.
WAITED_RECONNECT_MAX_S = 1.0
WAITED_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(WAITED_RECONNECT_MAX_S * 1000)),
    # its own subchannel: the process-wide pool would share the other channel's, backoff and all
    ("grpc.use_local_subchannel_pool", 1),
)
#: The guide's reconnect backoff: 1 s initial, x2, 30 s max.
BACKOFF = wait_exponential(
    multiplier=BACKOFF_INITIAL_S, exp_base=BACKOFF_FACTOR, min=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S
)


class RuntimeUnavailable(TemporaryError):
    """The Runtime did not answer (socket missing, restarting, slow, or garbage)."""


class RuntimeGarbage(RuntimeUnavailable):
    """The Runtime answered bytes that are not the message its interface promises."""


class MethodMissing(PermanentError):
    """This Runtime does not implement a method."""


class AllocationRefused(PermanentError):
    """The Runtime refused an allocation (bad ids, no room on the device)."""


@dataclass(frozen=True)
class DriverFacts:
    """What the Runtime says of the driver stack and of each device's hardware generation, for
    the node labels. Every field is empty from a Runtime older than it (interface v1.14 fields)."""

    driver_version: str = ""
    compute_capability: Mapping[str, str] = field(default_factory=dict)
    """Device id to its compute capability ("9.0"); devices the Runtime gives none are absent."""
    partition_modes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Device id to the partition modes it can be switched to (``mig``, ``tdm``)."""


_enum = enum_name


def _answer(method: str, client: RuntimeClient, reply: T | None) -> T:
    """grpc-aio hands back ``None`` when the reply did not parse (not protobuf, a proto3 string
    that is not UTF-8, a truncated field): one clear error naming the method instead of an
    AttributeError far away."""
    client.liveness.saw()  # it answered, garbage or not: alive
    if reply is None:
        client.on_garbage(method)
        raise RuntimeGarbage(
            f"Runtime DeviceService.{method} on {client.path} answered bytes that are not a valid "
            "reply: is the Runtime the version this plugin expects (lj.runtime.v1)?"
        )
    return reply


def _probe(path: str) -> str | None:
    """Why nothing takes a connection on the socket ``path`` now, or None when something does.
    One non-blocking connect: it never waits (a full backlog reads as there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            code = probe.connect_ex(path)
        except OSError:
            return None  # a path the probe cannot try (too long): gRPC's own error says it
    if code in (0, errno.EAGAIN, errno.EINPROGRESS):
        return None
    return "is missing" if code == errno.ENOENT else f"refuses connections ({os.strerror(code)})"


class RuntimeClient:
    """A DeviceService client on ``<socket_dir>/device-daemon.sock``."""

    def __init__(
        self,
        socket_dir: str,
        timeout: float = 5.0,
        *,
        on_garbage: Callable[[str], None] | None = None,
        on_dropped: Callable[[str], None] | None = None,
        restart_grace: float = RESTART_GRACE_S,
        liveness: Liveness | None = None,
    ) -> None:
        self.on_garbage = on_garbage or (lambda _: None)
        """Told the method name of each reply that did not parse (for a metric)."""
        self.screening = Screening(on_dropped)
        """What of the Runtime's replies is believed; ``on_dropped`` is told the field of each
        value left out (for a metric)."""
        self.liveness = liveness or Liveness(restart_grace)
        """When the Runtime was last seen alive: whether a socket that takes no connection is a
        restart (waited for) or a Runtime that is down (:mod:`liveness`)."""
        self.path = os.path.join(socket_dir, sockets.DEVICE_SOCKET)
        self.timeout = timeout
        self._channel = open_channel(self.path)
        self._stub = device_pb2_grpc.DeviceServiceStub(self._channel)
        """The shared shape's channel: GetVersion, ListDevices and WatchDevices (fail fast)."""
        self._waited = grpc.aio.insecure_channel(
            sockets.unix_target(self.path), options=WAITED_CHANNEL_OPTIONS
        )
        self._waited_stub = device_pb2_grpc.DeviceServiceStub(self._waited)
        """The calls a kubelet waits on (``wait_for_ready``, after :meth:`ready`)."""

    async def close(self) -> None:
        await self._channel.close()
        await self._waited.close()

    async def ready(self, method: str) -> float:
        """Return once the socket takes connections, with the seconds left of the call's
        deadline; raise :class:`RuntimeUnavailable` naming the socket at once when it takes none
        and no restart explains it, or at the deadline when a restart did not end by then."""
        if self._waited.get_state() == grpc.ChannelConnectivity.READY:
            self.liveness.saw()
            return self.timeout
        why = _probe(self.path)
        if why is not None:
            since = self.liveness.since_seen()
            if not self.liveness.restarting():
                raise RuntimeUnavailable(self._down(method, why, since))
            log.info(
                "runtime_restart_waited",
                socket=self.path,
                state=why,
                last_seen_s_ago=round(since or 0.0, 3),
                within_s=self.timeout,
                method=method,
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while why is not None:
            if loop.time() >= deadline:
                raise RuntimeUnavailable(
                    f"Runtime socket {self.path} {why} and did not take connections again within "
                    f"rpc_timeout ({self.timeout:g}s) of what looked like a restart: is the "
                    f"Runtime service running? (DeviceService.{method} not sent)"
                )
            await asyncio.sleep(SOCKET_POLL_S)
            why = _probe(self.path)
        self.liveness.saw()
        return max(deadline - loop.time(), SOCKET_POLL_S)

    def _down(self, method: str, why: str, since: float | None) -> str:
        seen = (
            "no Runtime has answered on it since this plugin started"
            if since is None
            else f"the Runtime was last seen {since:.0f}s ago, longer than runtime_restart_grace "
            f"({self.liveness.restart_grace_s:g}s) for a restart"
        )
        return (
            f"Runtime socket {self.path} {why}, and {seen}: is the Runtime service running? "
            f"(DeviceService.{method} not sent)"
        )

    def _unavailable(self, method: str, e: grpc.aio.AioRpcError) -> RuntimeUnavailable:
        where = self.path if os.path.exists(self.path) else f"{self.path} (missing)"
        return RuntimeUnavailable(
            f"Runtime {method} on {where} failed: {e.code().name} {e.details()}: "
            "is the Runtime service running?"
        )

    async def version(self) -> RuntimeInfo:
        try:
            r = await self._stub.GetVersion(device_pb2.GetVersionRequest(), timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("runtime_lacks_get_version", socket=self.path)
                return RuntimeInfo()
            raise self._unavailable("GetVersion", e) from e
        r = _answer("GetVersion", self, r)
        return RuntimeInfo(r.version, r.api_version, frozenset(r.capabilities))

    async def list_devices(self) -> list[Device]:
        try:
            r = await self._stub.ListDevices(device_pb2.ListDevicesRequest(), timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            raise self._unavailable("ListDevices", e) from e
        r = _answer("ListDevices", self, r)
        return self.screening.devices([device_from_proto(d) for d in r.devices])

    async def watch(self) -> AsyncIterator[tuple[str, list[Device]]]:
        """(event type, devices) from WatchDevices; the first is the full snapshot."""
        call = self._stub.WatchDevices(device_pb2.WatchDevicesRequest())
        opened = False
        try:
            async for raw in call:
                ev = _answer("WatchDevices", self, raw)
                if not opened:
                    opened = True
                    self.liveness.stream_opened()
                kind = _enum(device_pb2.DeviceEventType, ev.type, "DEVICE_EVENT_TYPE_")
                devices = [device_from_proto(d) for d in ev.devices]
                yield kind, self.screening.devices(devices, complete=kind == "snapshot")
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise MethodMissing(f"this Runtime lacks {WATCH_DEVICES}") from e
            raise self._unavailable("WatchDevices", e) from e
        finally:
            call.cancel()
            if opened:
                self.liveness.stream_closed()
        raise RuntimeUnavailable(f"Runtime {WATCH_DEVICES} stream on {self.path} ended")

    async def allocate(
        self,
        *,
        pod: tuple[str, str, str],
        container: str,
        resource: str,
        device_ids: list[str],
        core_percent: int = 0,
        memory_bytes: int = 0,
    ) -> Allocation:
        req = device_pb2.AllocateRequest(
            pod=device_pb2.PodRef(namespace=pod[0], name=pod[1], uid=pod[2]),
            container=container,
            resource_name=resource,
            device_ids=device_ids,
            core_percent=core_percent,
            memory_bytes=memory_bytes,
        )
        left = await self.ready("Allocate")
        try:
            # wait_for_ready: a Runtime restarting (an upgrade window) is waited for, within the
            # timeout, instead of failing the admission at once while the channel reconnects
            r = await self._waited_stub.Allocate(req, timeout=left, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            if e.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.FAILED_PRECONDITION,
            ):
                raise AllocationRefused(
                    f"Runtime refused allocation of {device_ids}: {e.details()}"
                ) from e
            raise self._unavailable("Allocate", e) from e
        return self.allocation(_answer("Allocate", self, r).allocation)

    def allocation(self, a: device_pb2.Allocation) -> Allocation:
        """One allocation of a reply, its impossible values counted and logged (kept: it is
        what the Runtime holds; headroom gives its devices no share)."""
        out = allocation_from_proto(a)
        self.screening.allocations([out], complete=False)
        return out


async def driver_facts(client: RuntimeClient) -> DriverFacts:
    """One GetVersion and one ListDevices: the facts :class:`model.Device` does not carry.

    A Runtime without GetVersion gives no driver version (not an error: labels leave it out)."""
    version = ""
    try:
        v = await client._stub.GetVersion(device_pb2.GetVersionRequest(), timeout=client.timeout)
        version = _answer("GetVersion", client, v).driver_version
    except grpc.aio.AioRpcError as e:
        if e.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise client._unavailable("GetVersion", e) from e
    try:
        r = await client._stub.ListDevices(device_pb2.ListDevicesRequest(), timeout=client.timeout)
    except grpc.aio.AioRpcError as e:
        raise client._unavailable("ListDevices", e) from e
    devices = _answer("ListDevices", client, r).devices
    modes = {
        d.id: frozenset(
            m
            for m in (
                _enum(device_pb2.PartitionMode, n, "PARTITION_MODE_")
                for n in d.supported_partition_modes
            )
            if m in ("mig", "tdm")
        )
        for d in devices
    }
    return DriverFacts(
        driver_version=version,
        compute_capability={d.id: d.compute_capability for d in devices if d.compute_capability},
        partition_modes={i: m for i, m in modes.items() if m},
    )


def retrying(what: str) -> AsyncRetrying:
    """Retry RuntimeUnavailable forever with the guide's backoff, logging each wait."""

    def before_sleep(state: object) -> None:
        outcome = getattr(state, "outcome", None)
        nxt = getattr(getattr(state, "next_action", None), "sleep", None)
        log.warning(
            "runtime_unavailable",
            during=what,
            error=str(outcome.exception()) if outcome is not None else "",
            retry_in_s=nxt,
        )

    return AsyncRetrying(
        retry=retry_if_exception_type(RuntimeUnavailable),
        wait=BACKOFF,
        before_sleep=before_sleep,
        reraise=True,
    )


async def release(client: RuntimeClient, allocation_id: str) -> int:
    """Free one allocation (unknown ids are not an error); how many were freed."""
    left = await client.ready("Release")
    try:
        r = await client._waited_stub.Release(
            device_pb2.ReleaseRequest(allocation_id=allocation_id),
            timeout=left,
            wait_for_ready=True,
        )
    except grpc.aio.AioRpcError as e:
        raise client._unavailable("Release", e) from e
    return int(_answer("Release", client, r).released)


async def allocations(client: RuntimeClient) -> list[Allocation]:
    """Every live allocation on the node."""
    left = await client.ready("ListAllocations")
    try:
        r = await client._waited_stub.ListAllocations(
            device_pb2.ListAllocationsRequest(), timeout=left, wait_for_ready=True
        )
    except grpc.aio.AioRpcError as e:
        raise client._unavailable("ListAllocations", e) from e
    r = _answer("ListAllocations", client, r)
    out = [allocation_from_proto(a) for a in r.allocations]
    client.screening.allocations(out, complete=True)
    return out


async def update_owner(
    client: RuntimeClient, allocation_id: str, pod: tuple[str, str, str], container: str
) -> Allocation:
    """Record the real owner of an allocation; :class:`MethodMissing` on an older Runtime."""
    req = device_pb2.UpdateAllocationOwnerRequest(
        allocation_id=allocation_id,
        pod=device_pb2.PodRef(namespace=pod[0], name=pod[1], uid=pod[2]),
        container=container,
    )
    left = await client.ready("UpdateAllocationOwner")
    try:
        r = await client._waited_stub.UpdateAllocationOwner(req, timeout=left, wait_for_ready=True)
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise MethodMissing(f"this Runtime lacks {UPDATE_OWNER}") from e
        if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            raise AllocationRefused(f"Runtime refused {UPDATE_OWNER}: {e.details()}") from e
        raise client._unavailable("UpdateAllocationOwner", e) from e
    return client.allocation(_answer("UpdateAllocationOwner", client, r).allocation)


async def allocation_ids(client: RuntimeClient) -> list[str]:
    """Ids of every live allocation on the node."""
    return [a.id for a in await allocations(client)]
