"""The only module that talks to the Runtime: DeviceService and MonitorService over unix sockets.

Protobuf messages become :mod:`snapshot` data here, once. An older Runtime that lacks a method
(``UNIMPLEMENTED``, or absent from GetVersion's capabilities) degrades that part: the method is
remembered as missing and logged once, and the rest of the poll goes on.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TypeVar

import grpc
import structlog

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import (
    device_pb2,
    device_pb2_grpc,
    monitor_pb2,
    monitor_pb2_grpc,
)

from .errors import PermanentError, TemporaryError
from .runtime_channel import enum_name, open_channel
from .snapshot import (
    Allocation,
    Device,
    DeviceSample,
    LinkSample,
    PartitionSample,
    RuntimeState,
    Usage,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")

LIST_ALLOCATIONS = "DeviceService.ListAllocations"
ALLOCATION_USAGE = "MonitorService.GetAllocationUsage"
DEVICE_METRICS = "MonitorService.GetDeviceMetrics"
# Without these the exporter still serves what it can (inventory and health need ListDevices).
_OPTIONAL = (DEVICE_METRICS, LIST_ALLOCATIONS, ALLOCATION_USAGE)


class RuntimeUnavailable(TemporaryError):
    """The Runtime did not answer (socket missing, restarting, slow, or garbage)."""


class RuntimeGarbage(RuntimeUnavailable):
    """The Runtime answered bytes that are not the message its interface promises."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(
            f"Runtime {method} on {path} answered bytes that are not a valid reply: is the "
            "Runtime the version this exporter expects (lj.runtime.v1)?"
        )
        self.method = method


class MethodMissing(PermanentError):
    """This Runtime does not implement a method."""


def _answer(method: str, path: str, reply: T | None) -> T:
    """grpc-aio hands back ``None`` for a reply that did not parse (not protobuf, a proto3
    string that is not UTF-8): one clear error naming the method instead of an AttributeError
    that ended the poll loop."""
    if reply is None:
        raise RuntimeGarbage(method, path)
    return reply


def device_from_proto(d: device_pb2.Device) -> Device:
    return Device(
        id=d.id,
        uuid=d.uuid,
        index=d.index,
        kind=enum_name(device_pb2.DeviceKind, d.kind, "DEVICE_KIND_"),
        model=d.model,
        vendor=d.vendor,
        memory_bytes=float(d.memory_bytes),
        healthy=d.health.state != device_pb2.HEALTH_STATE_UNHEALTHY,
        partition_mode=enum_name(device_pb2.PartitionMode, d.partition_mode, "PARTITION_MODE_"),
        partition_profiles={p.id: p.profile for p in d.partitions},
    )


def sample_from_proto(m: monitor_pb2.DeviceMetrics) -> DeviceSample:
    e = m.errors
    return DeviceSample(
        device_id=m.device_id,
        utilization_ratio=m.utilization_ratio,
        memory_utilization_ratio=m.memory_utilization_ratio,
        memory_used_bytes=float(m.memory_used_bytes),
        memory_total_bytes=float(m.memory_total_bytes),
        temperature_celsius=m.temperature_celsius,
        memory_temperature_celsius=m.memory_temperature_celsius,
        power_watts=m.power_watts,
        power_limit_watts=m.power_limit_watts,
        energy_joules_total=m.energy_joules_total,
        sm_clock_hertz=m.sm_clock_hertz,
        memory_clock_hertz=m.memory_clock_hertz,
        ecc_single_bit_total=float(e.ecc_single_bit_total),
        ecc_double_bit_total=float(e.ecc_double_bit_total),
        retired_pages_total=float(e.retired_pages_total),
        xid_total=float(e.xid_total),
        link_errors_total=float(e.link_errors_total),
        last_xid=float(e.last_xid),
        pcie_tx_bytes_total=float(m.pcie_tx_bytes_total),
        pcie_rx_bytes_total=float(m.pcie_rx_bytes_total),
        links=tuple(
            LinkSample(x.peer_id, float(x.tx_bytes_total), float(x.rx_bytes_total)) for x in m.links
        ),
        partitions=tuple(
            PartitionSample(
                p.partition_id,
                "",
                p.utilization_ratio,
                float(p.memory_used_bytes),
                float(p.memory_total_bytes),
            )
            for p in m.partitions
        ),
    )


def allocation_from_proto(a: device_pb2.Allocation) -> Allocation:
    return Allocation(
        id=a.id,
        namespace=a.pod.namespace,
        pod=a.pod.name,
        pod_uid=a.pod.uid,
        container=a.container,
        resource_name=a.resource_name,
        device_ids=tuple(a.device_ids),
        core_percent=a.core_percent,
        memory_bytes=float(a.memory_bytes),
    )


class RuntimeClient:
    """Reads the Runtime's state; one instance per exporter, channels reused across polls."""

    def __init__(self, socket_dir: str, timeout: float) -> None:
        self._device_path = os.path.join(socket_dir, sockets.DEVICE_SOCKET)
        self._monitor_path = os.path.join(socket_dir, sockets.MONITOR_SOCKET)
        self._timeout = timeout
        self.missing: set[str] = set()
        """Optional methods found missing on the current Runtime (reset on reconnect)."""
        self.invalid: set[str] = set()
        """Optional methods whose reply did not parse in the last read (their part left out)."""
        self.invalid_before: set[str] = set()
        self._open()

    def _open(self) -> None:
        self._device_ch = open_channel(self._device_path)
        self._monitor_ch = open_channel(self._monitor_path)
        self._device = device_pb2_grpc.DeviceServiceStub(self._device_ch)
        self._monitor = monitor_pb2_grpc.MonitorServiceStub(self._monitor_ch)

    async def reconnect(self) -> None:
        """Fresh channels, so the next call dials the (restarted) Runtime at once."""
        await self.close()
        self._open()

    async def __aenter__(self) -> RuntimeClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._device_ch.close()
        await self._monitor_ch.close()

    def _unavailable(self, method: str, err: grpc.aio.AioRpcError) -> RuntimeUnavailable:
        path = self._path_of(method)
        if not os.path.exists(path):
            return RuntimeUnavailable(
                f"Runtime socket {path} not found: is the Runtime service running?"
            )
        return RuntimeUnavailable(
            f"Runtime {method} failed on {path}: {err.code().name} {err.details()}"
        )

    def _mark_missing(self, method: str, why: str) -> None:
        if method not in self.missing:
            self.missing.add(method)
            log.warning(
                "runtime_method_missing",
                method=method,
                why=why,
                effect="metrics that need it are left out; upgrade the Runtime to get them",
            )

    async def version(self) -> tuple[str, str]:
        """Version and interface version; resets what is known missing (a new Runtime)."""
        self.missing = set()
        try:
            r = await self._device.GetVersion(device_pb2.GetVersionRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("runtime_version_unknown", why="GetVersion is UNIMPLEMENTED")
                return "unknown", "unknown"
            raise self._unavailable("DeviceService.GetVersion", e) from e
        r = _answer("DeviceService.GetVersion", self._device_path, r)
        caps = set(r.capabilities)
        if caps:
            for method in _OPTIONAL:
                if method not in caps:
                    self._mark_missing(method, "not in GetVersion capabilities")
        return r.version or "unknown", r.api_version or "unknown"

    async def read(self, version: tuple[str, str]) -> RuntimeState:
        """One consistent read of devices, metrics, allocations and per-allocation usage."""
        try:
            devices = await self._device.ListDevices(
                device_pb2.ListDevicesRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as e:
            raise self._unavailable("DeviceService.ListDevices", e) from e
        devices = _answer("DeviceService.ListDevices", self._device_path, devices)
        self.invalid_before, self.invalid = self.invalid, set()
        samples: tuple[DeviceSample, ...] = ()
        if DEVICE_METRICS not in self.missing:
            try:
                metrics = await self._monitor.GetDeviceMetrics(
                    monitor_pb2.GetDeviceMetricsRequest(), timeout=self._timeout
                )
            except grpc.aio.AioRpcError as e:
                self._optional_failed(DEVICE_METRICS, e)
            else:
                if self._parsed(DEVICE_METRICS, metrics):
                    samples = tuple(sample_from_proto(m) for m in metrics.devices)
        allocations = await self._allocations()
        usage = await self._usage() if allocations is not None else None
        return RuntimeState(
            version=version[0],
            api_version=version[1],
            devices=tuple(device_from_proto(d) for d in devices.devices),
            samples=samples,
            allocations=allocations,
            usage=usage,
        )

    async def _allocations(self) -> tuple[Allocation, ...] | None:
        if LIST_ALLOCATIONS in self.missing:
            return None
        try:
            r = await self._device.ListAllocations(
                device_pb2.ListAllocationsRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as e:
            self._optional_failed(LIST_ALLOCATIONS, e)
            return None
        if not self._parsed(LIST_ALLOCATIONS, r):
            return None
        return tuple(allocation_from_proto(a) for a in r.allocations)

    async def _usage(self) -> tuple[Usage, ...] | None:
        if ALLOCATION_USAGE in self.missing:
            return None
        try:
            r = await self._monitor.GetAllocationUsage(
                monitor_pb2.GetAllocationUsageRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as e:
            self._optional_failed(ALLOCATION_USAGE, e)
            return None
        if not self._parsed(ALLOCATION_USAGE, r):
            return None
        return tuple(
            Usage(u.allocation_id, u.device_id, u.utilization_ratio, float(u.memory_used_bytes))
            for u in r.usage
        )

    def _parsed(self, method: str, reply: object) -> bool:
        """Whether an optional method's reply parsed; one that did not leaves that part out of
        this round (the rest is served) and is remembered in ``invalid``."""
        if reply is not None:
            return True
        if method not in self.invalid_before:
            log.error(
                "runtime_invalid_reply",
                method=method,
                error=str(RuntimeGarbage(method, self._path_of(method))),
                effect="the metrics that need it are left out until it answers sanely",
            )
        self.invalid.add(method)
        return False

    def _path_of(self, method: str) -> str:
        return self._monitor_path if method.startswith("Monitor") else self._device_path

    def _optional_failed(self, method: str, e: grpc.aio.AioRpcError) -> None:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            self._mark_missing(method, "UNIMPLEMENTED")
            return
        raise self._unavailable(method, e) from e
