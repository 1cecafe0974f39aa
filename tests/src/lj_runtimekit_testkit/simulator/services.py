"""The Runtime's three gRPC services over one ``NodeState``, with the fault switches at the edge.

Every call first passes ``Faults.enter``: a method missing from the capabilities answers
UNIMPLEMENTED (an older Runtime), then any injected delay and failure apply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import config_pb2_grpc as cgrpc
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_interface.runtime.v1 import device_pb2_grpc as dgrpc
from lj_runtimekit_interface.runtime.v1 import monitor_pb2 as mpb
from lj_runtimekit_interface.runtime.v1 import monitor_pb2_grpc as mgrpc
from lj_runtimekit_testkit.simulator import metrics
from lj_runtimekit_testkit.simulator.inventory import Device, Mode
from lj_runtimekit_testkit.simulator.ledger import PodRef, Refusal, RuntimeRefusal
from lj_runtimekit_testkit.simulator.node import NodeState
from lj_runtimekit_testkit.simulator.wire import BINDINGS, allocation_pb, device_pb, request_from_pb

Context = grpc.aio.ServicerContext[Any, Any]
API_VERSION = "v1"
METHODS = {
    "DeviceService": (
        "GetVersion",
        "ListDevices",
        "WatchDevices",
        "Allocate",
        "Release",
        "ListAllocations",
        "UpdateAllocationOwner",
    ),
    "MonitorService": ("GetDeviceMetrics", "GetAllocationUsage"),
    "ConfigService": (
        "GetFeatureState",
        "SetFeatures",
        "SetPartitioning",
        "SetDeviceBinding",
        "CreatePartition",
        "DeletePartition",
    ),
}
#: A Runtime without this method predates Device.binding too: it leaves the field unset.
SET_DEVICE_BINDING = "ConfigService.SetDeviceBinding"
ALL_METHODS = tuple(f"{s}.{m}" for s, ms in METHODS.items() for m in ms)
FEATURE_CAPABILITIES = ("mig", "tdm", "sharing")
DEFAULT_CAPABILITIES = ALL_METHODS + FEATURE_CAPABILITIES
_CODES = {
    Refusal.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Refusal.PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
}
_BINDING_OF = {v: k for k, v in BINDINGS.items()}
_EVENTS = {
    "ADDED": pb.DEVICE_EVENT_TYPE_ADDED,
    "REMOVED": pb.DEVICE_EVENT_TYPE_REMOVED,
    "HEALTH_CHANGED": pb.DEVICE_EVENT_TYPE_HEALTH_CHANGED,
    "PARTITIONS_CHANGED": pb.DEVICE_EVENT_TYPE_PARTITIONS_CHANGED,
}


def full_method(method: str) -> str:
    """``Allocate`` or ``DeviceService.Allocate`` → ``DeviceService.Allocate``; else ValueError."""
    if method in ALL_METHODS:
        return method
    matches = [m for m in ALL_METHODS if m.split(".")[1] == method]
    if len(matches) != 1:
        raise ValueError(f"unknown Runtime method {method!r}; known: {list(ALL_METHODS)}")
    return matches[0]


@dataclass
class Faults:
    """Injected failures and delays per method, and the capabilities this Runtime claims."""

    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    failures: dict[str, tuple[grpc.StatusCode | None, float]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def knows_binding(self) -> bool:
        """Whether this Runtime is new enough to report Device.binding."""
        return SET_DEVICE_BINDING in self.capabilities

    async def enter(self, method: str, context: Context) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if method not in self.capabilities and method != "DeviceService.GetVersion":
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"Method not found: lj.runtime.v1.{method} (older Runtime)",
            )
        code, delay = self.failures.get(method, (None, 0.0))
        if delay:
            await asyncio.sleep(delay)
        if code is not None:
            await context.abort(code, f"injected failure of {method} (simulator)")


async def _refused(context: Context, e: RuntimeRefusal) -> NoReturn:
    await context.abort(_CODES[e.kind], e.message)


def _now() -> Timestamp:
    ts = Timestamp()
    ts.GetCurrentTime()
    return ts


class DeviceService(dgrpc.DeviceServiceServicer):
    def __init__(self, node: NodeState, faults: Faults) -> None:
        self.node, self.faults = node, faults

    def _devices(self, devices: Iterable[Device]) -> list[pb.Device]:
        return [device_pb(d, binding=self.faults.knows_binding) for d in devices]

    async def GetVersion(
        self, request: pb.GetVersionRequest, context: Context
    ) -> pb.GetVersionResponse:
        await self.faults.enter("DeviceService.GetVersion", context)
        return pb.GetVersionResponse(
            version=self.node.inventory.runtime_version,
            api_version=API_VERSION,
            capabilities=list(self.faults.capabilities),
            driver_version=self.node.inventory.driver_version,
        )

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: Context
    ) -> pb.ListDevicesResponse:
        await self.faults.enter("DeviceService.ListDevices", context)
        return pb.ListDevicesResponse(devices=self._devices(self.node.devices.values()))

    async def WatchDevices(
        self, request: pb.WatchDevicesRequest, context: Context
    ) -> AsyncIterator[pb.WatchDevicesResponse]:
        await self.faults.enter("DeviceService.WatchDevices", context)
        queue = self.node.subscribe()
        try:
            yield pb.WatchDevicesResponse(
                type=pb.DEVICE_EVENT_TYPE_SNAPSHOT,
                devices=self._devices(self.node.devices.values()),
            )
            while (event := await queue.get()) is not None:
                yield pb.WatchDevicesResponse(
                    type=_EVENTS[event.kind], devices=self._devices(event.devices)
                )
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Runtime is shutting down")
        finally:
            self.node.unsubscribe(queue)

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        await self.faults.enter("DeviceService.Allocate", context)
        try:
            alloc = self.node.allocate(request_from_pb(request))
        except RuntimeRefusal as e:
            await _refused(context, e)
        return pb.AllocateResponse(allocation=allocation_pb(alloc))

    async def Release(self, request: pb.ReleaseRequest, context: Context) -> pb.ReleaseResponse:
        await self.faults.enter("DeviceService.Release", context)
        if not request.allocation_id and not request.pod.uid:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "release: give allocation_id, or pod.uid to free a whole pod",
            )
        return pb.ReleaseResponse(
            released=self.node.release(request.allocation_id, request.pod.uid)
        )

    async def ListAllocations(
        self, request: pb.ListAllocationsRequest, context: Context
    ) -> pb.ListAllocationsResponse:
        await self.faults.enter("DeviceService.ListAllocations", context)
        return pb.ListAllocationsResponse(
            allocations=[allocation_pb(a) for a in self.node.ledger.allocations.values()]
        )

    async def UpdateAllocationOwner(
        self, request: pb.UpdateAllocationOwnerRequest, context: Context
    ) -> pb.UpdateAllocationOwnerResponse:
        await self.faults.enter("DeviceService.UpdateAllocationOwner", context)
        pod = PodRef(request.pod.namespace, request.pod.name, request.pod.uid)
        try:
            alloc = self.node.reown(request.allocation_id, pod, request.container)
        except RuntimeRefusal as e:
            await _refused(context, e)
        return pb.UpdateAllocationOwnerResponse(allocation=allocation_pb(alloc))


class MonitorService(mgrpc.MonitorServiceServicer):
    def __init__(self, node: NodeState, faults: Faults) -> None:
        self.node, self.faults = node, faults
        self.started = time.monotonic()

    def _usage(self) -> list[mpb.AllocationUsage]:
        elapsed = time.monotonic() - self.started
        out = []
        for alloc in self.node.ledger.allocations.values():
            for unit in alloc.device_ids:
                dev = next(
                    (
                        d
                        for d in self.node.devices.values()
                        if d.id == unit or any(p.id == unit for p in d.partitions)
                    ),
                    None,
                )
                if dev is not None:
                    out.append(metrics.allocation_usage(alloc, dev, unit, elapsed))
        return out

    async def GetDeviceMetrics(
        self, request: mpb.GetDeviceMetricsRequest, context: Context
    ) -> mpb.GetDeviceMetricsResponse:
        await self.faults.enter("MonitorService.GetDeviceMetrics", context)
        unknown = sorted(set(request.device_ids) - set(self.node.devices))
        if unknown:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown devices {unknown}")
        usage = self._usage()
        elapsed = time.monotonic() - self.started
        wanted = request.device_ids or list(self.node.devices)
        out = []
        for dev_id in wanted:
            dev = self.node.devices[dev_id]
            units = {dev.id} | {p.id for p in dev.partitions}
            out.append(
                metrics.device_metrics(dev, [u for u in usage if u.device_id in units], elapsed)
            )
        return mpb.GetDeviceMetricsResponse(sampled_at=_now(), devices=out)

    async def GetAllocationUsage(
        self, request: mpb.GetAllocationUsageRequest, context: Context
    ) -> mpb.GetAllocationUsageResponse:
        await self.faults.enter("MonitorService.GetAllocationUsage", context)
        return mpb.GetAllocationUsageResponse(sampled_at=_now(), usage=self._usage())


class ConfigService(cgrpc.ConfigServiceServicer):
    def __init__(self, node: NodeState, faults: Faults) -> None:
        self.node, self.faults = node, faults

    def _state(self) -> cpb.GetFeatureStateResponse:
        return cpb.GetFeatureStateResponse(
            enabled=self.node.enabled,
            features=[cpb.Feature(name=n, enabled=on) for n, on in self.node.features.items()],
            runtime_version=self.node.inventory.runtime_version,
        )

    async def GetFeatureState(
        self, request: cpb.GetFeatureStateRequest, context: Context
    ) -> cpb.GetFeatureStateResponse:
        await self.faults.enter("ConfigService.GetFeatureState", context)
        return self._state()

    async def SetFeatures(
        self, request: cpb.SetFeaturesRequest, context: Context
    ) -> cpb.SetFeaturesResponse:
        await self.faults.enter("ConfigService.SetFeatures", context)
        try:
            changed = self.node.set_features(request.enabled, list(request.features))
        except RuntimeRefusal as e:
            await _refused(context, e)
        return cpb.SetFeaturesResponse(changed=changed, state=self._state())

    async def SetPartitioning(
        self, request: cpb.SetPartitioningRequest, context: Context
    ) -> cpb.SetPartitioningResponse:
        await self.faults.enter("ConfigService.SetPartitioning", context)
        try:
            if request.HasField("mig") and request.HasField("tdm"):
                raise RuntimeRefusal(
                    Refusal.PRECONDITION,
                    f"{request.device_id}: MIG and TDM "
                    "on one GPU are exclusive; ask for one of them",
                )
            if request.HasField("mig"):
                dev = self.node.set_partitioning(
                    request.device_id, Mode.MIG, list(request.mig.profiles)
                )
            elif request.HasField("tdm"):
                dev = self.node.set_partitioning(
                    request.device_id, Mode.TDM, list(request.tdm.slice_percents)
                )
            else:
                dev = self.node.set_partitioning(request.device_id, Mode.NONE, [])
        except RuntimeRefusal as e:
            await _refused(context, e)
        return cpb.SetPartitioningResponse(
            device_id=dev.id, partition_ids=[p.id for p in dev.partitions]
        )

    async def CreatePartition(
        self, request: cpb.CreatePartitionRequest, context: Context
    ) -> cpb.CreatePartitionResponse:
        await self.faults.enter("ConfigService.CreatePartition", context)
        try:
            which = request.WhichOneof("spec")
            if which == "mig_profile":
                dev, part_id = self.node.create_partition(
                    request.device_id, Mode.MIG, request.mig_profile
                )
            elif which == "tdm_percent":
                dev, part_id = self.node.create_partition(
                    request.device_id, Mode.TDM, request.tdm_percent
                )
            else:
                raise RuntimeRefusal(
                    Refusal.INVALID,
                    f"{request.device_id}: give mig_profile or tdm_percent",
                )
        except RuntimeRefusal as e:
            await _refused(context, e)
        return cpb.CreatePartitionResponse(partition_id=part_id, device=device_pb(dev))

    async def DeletePartition(
        self, request: cpb.DeletePartitionRequest, context: Context
    ) -> cpb.DeletePartitionResponse:
        await self.faults.enter("ConfigService.DeletePartition", context)
        try:
            dev, _ = self.node.delete_partition(request.partition_id)
        except RuntimeRefusal as e:
            await _refused(context, e)
        return cpb.DeletePartitionResponse(device=device_pb(dev))

    async def SetDeviceBinding(
        self, request: cpb.SetDeviceBindingRequest, context: Context
    ) -> cpb.SetDeviceBindingResponse:
        await self.faults.enter(SET_DEVICE_BINDING, context)
        wanted = _BINDING_OF.get(request.binding)
        try:
            if wanted is None:
                raise RuntimeRefusal(
                    Refusal.INVALID,
                    f"{request.device_id}: binding {request.binding} is not one of "
                    "DEVICE_BINDING_DRIVER, DEVICE_BINDING_VFIO",
                )
            dev, changed = self.node.set_binding(request.device_id, wanted)
        except RuntimeRefusal as e:
            await _refused(context, e)
        return cpb.SetDeviceBindingResponse(device=device_pb(dev), changed=changed)
