"""The only module that talks to the Runtime: DeviceService over its unix socket.

Protobuf messages become :mod:`model` data here, once. The channel, the call conventions and the
enum decoding are the shared shape of :mod:`.runtime_channel`; reconnects of the watch follow the
guide's backoff (1 s, x2, 30 s max) through tenacity. An older Runtime that lacks WatchDevices
(absent from GetVersion's capabilities, or UNIMPLEMENTED) degrades to the periodic check with one
clear log.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc

from .errors import PermanentError, TemporaryError
from .model import Allocation, Device, Injection, Link, Partition, RuntimeInfo, screen
from .runtime_channel import (
    BACKOFF_FACTOR,
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    UNKNOWN,
    enum_name,
    open_channel,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")

WATCH_DEVICES = "DeviceService.WatchDevices"
UPDATE_OWNER = "DeviceService.UpdateAllocationOwner"
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


def health_from_proto(h: device_pb2.Health) -> tuple[bool, str]:
    """(healthy, reason): healthy only when the Runtime says so. An unset state or a number
    this build does not know (a newer Runtime's) reads as unknown, and the device is withheld
    (Unhealthy to the kubelet) until its health is known."""
    state = _enum(device_pb2.HealthState, h.state, "HEALTH_STATE_")
    if state == "healthy":
        return True, h.reason
    if state == "unhealthy":
        return False, h.reason
    said = "no health state" if state == "unspecified" else f"health state {h.state}"
    known = f": {h.reason}" if h.reason else ""
    return False, f"health unknown (the Runtime reported {said}{known}); withheld until known"


def device_from_proto(d: device_pb2.Device) -> Device:
    """One Runtime device as domain data; unknown enum numbers read as ``unknown``."""
    mode = _enum(device_pb2.PartitionMode, d.partition_mode, "PARTITION_MODE_")
    binding = _enum(device_pb2.DeviceBinding, d.binding, "DEVICE_BINDING_")
    return Device(
        id=d.id,
        uuid=d.uuid,
        index=d.index,
        kind=_enum(device_pb2.DeviceKind, d.kind, "DEVICE_KIND_"),
        vendor=d.vendor,
        model=d.model,
        memory_bytes=d.memory_bytes,
        compute_units=d.compute_units,
        numa_node=d.numa_node,
        pci_bus_id=d.pci_bus_id,
        links=tuple(
            Link(lk.peer_id, _enum(device_pb2.LinkType, lk.type, "LINK_TYPE_"), lk.bandwidth_gbps)
            for lk in d.links
        ),
        partition_mode="none" if mode in ("unspecified", UNKNOWN) else mode,
        partitions=tuple(
            Partition(
                id=p.id,
                profile=p.profile,
                memory_bytes=p.memory_bytes,
                compute_units=p.compute_units,
                time_percent=p.time_percent,
                healthy=health_from_proto(p.health)[0],
                reason=health_from_proto(p.health)[1],
            )
            for p in d.partitions
        ),
        healthy=health_from_proto(d.health)[0],
        reason=health_from_proto(d.health)[1],
        device_nodes=tuple(d.device_nodes),
        # unset: a Runtime older than the field, whose devices are all on the vendor's driver
        binding="driver" if binding == "unspecified" else binding,
        pcie_root=d.pcie_root,
        partition_modes=frozenset(
            m
            for m in (
                _enum(device_pb2.PartitionMode, n, "PARTITION_MODE_")
                for n in d.supported_partition_modes
            )
            if m in ("mig", "tdm")
        ),
    )


def allocation_from_proto(a: device_pb2.Allocation) -> Allocation:
    inj = a.injection
    return Allocation(
        id=a.id,
        device_ids=tuple(a.device_ids),
        core_percent=a.core_percent,
        memory_bytes=a.memory_bytes,
        pod=(a.pod.namespace, a.pod.name, a.pod.uid),
        container=a.container,
        resource=a.resource_name,
        injection=Injection(
            envs=tuple(sorted(inj.envs.items())),
            annotations=tuple(sorted(inj.annotations.items())),
            device_nodes=tuple(
                (n.container_path, n.host_path, n.permissions) for n in inj.device_nodes
            ),
            mounts=tuple((m.container_path, m.host_path, m.read_only) for m in inj.mounts),
        ),
    )


def _answer(method: str, client: RuntimeClient, reply: T | None) -> T:
    """grpc-aio hands back ``None`` when the reply did not parse (not protobuf, a proto3 string
    that is not UTF-8, a truncated field): one clear error naming the method instead of an
    AttributeError far away."""
    if reply is None:
        client.on_garbage(method)
        raise RuntimeGarbage(
            f"Runtime DeviceService.{method} on {client.path} answered bytes that are not a valid "
            "reply: is the Runtime the version this plugin expects (lj.runtime.v1)?"
        )
    return reply


def _validate(devices: list[Device]) -> list[Device]:
    ids = [d.id for d in devices]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise RuntimeUnavailable(f"Runtime answered an inventory with empty or repeated ids: {ids}")
    return devices


class RuntimeClient:
    """A DeviceService client on ``<socket_dir>/device-daemon.sock``."""

    def __init__(
        self,
        socket_dir: str,
        timeout: float = 5.0,
        *,
        on_garbage: Callable[[str], None] | None = None,
    ) -> None:
        self.on_garbage = on_garbage or (lambda _: None)
        """Told the method name of each reply that did not parse (for a metric)."""
        self.path = os.path.join(socket_dir, sockets.DEVICE_SOCKET)
        self.timeout = timeout
        self._channel = open_channel(self.path)
        self._stub = device_pb2_grpc.DeviceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

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
        return screen(_validate([device_from_proto(d) for d in r.devices]))

    async def watch(self) -> AsyncIterator[tuple[str, list[Device]]]:
        """(event type, devices) from WatchDevices; the first is the full snapshot."""
        call = self._stub.WatchDevices(device_pb2.WatchDevicesRequest())
        try:
            async for raw in call:
                ev = _answer("WatchDevices", self, raw)
                kind = _enum(device_pb2.DeviceEventType, ev.type, "DEVICE_EVENT_TYPE_")
                yield kind, screen([device_from_proto(d) for d in ev.devices])
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise MethodMissing(f"this Runtime lacks {WATCH_DEVICES}") from e
            raise self._unavailable("WatchDevices", e) from e
        finally:
            call.cancel()
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
        try:
            # wait_for_ready: a Runtime restarting (an upgrade window) is waited for, within the
            # timeout, instead of failing the admission at once while the channel reconnects
            r = await self._stub.Allocate(req, timeout=self.timeout, wait_for_ready=True)
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
        return allocation_from_proto(_answer("Allocate", self, r).allocation)


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
    try:
        r = await client._stub.Release(
            device_pb2.ReleaseRequest(allocation_id=allocation_id),
            timeout=client.timeout,
            wait_for_ready=True,
        )
    except grpc.aio.AioRpcError as e:
        raise client._unavailable("Release", e) from e
    return int(_answer("Release", client, r).released)


async def allocations(client: RuntimeClient) -> list[Allocation]:
    """Every live allocation on the node."""
    try:
        r = await client._stub.ListAllocations(
            device_pb2.ListAllocationsRequest(), timeout=client.timeout, wait_for_ready=True
        )
    except grpc.aio.AioRpcError as e:
        raise client._unavailable("ListAllocations", e) from e
    r = _answer("ListAllocations", client, r)
    return [allocation_from_proto(a) for a in r.allocations]


async def update_owner(
    client: RuntimeClient, allocation_id: str, pod: tuple[str, str, str], container: str
) -> Allocation:
    """Record the real owner of an allocation; :class:`MethodMissing` on an older Runtime."""
    req = device_pb2.UpdateAllocationOwnerRequest(
        allocation_id=allocation_id,
        pod=device_pb2.PodRef(namespace=pod[0], name=pod[1], uid=pod[2]),
        container=container,
    )
    try:
        r = await client._stub.UpdateAllocationOwner(
            req, timeout=client.timeout, wait_for_ready=True
        )
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise MethodMissing(f"this Runtime lacks {UPDATE_OWNER}") from e
        if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            raise AllocationRefused(f"Runtime refused {UPDATE_OWNER}: {e.details()}") from e
        raise client._unavailable("UpdateAllocationOwner", e) from e
    return allocation_from_proto(_answer("UpdateAllocationOwner", client, r).allocation)


async def allocation_ids(client: RuntimeClient) -> list[str]:
    """Ids of every live allocation on the node."""
    return [a.id for a in await allocations(client)]
