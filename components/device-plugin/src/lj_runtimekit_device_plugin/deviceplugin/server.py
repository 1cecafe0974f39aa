"""The kubelet's device plugin API: one DevicePlugin servicer per resource, its own socket.

Servicers subclass the generated base and keep the proto's method names. Domain errors become
gRPC status codes only here (``context.abort``).

On a node moved back from DRA with claims still prepared, ``withheld`` (a :class:`Handover`)
names the devices those claims hold: their units are listed Unhealthy until the kubelet
unprepares the claims (:mod:`..handover`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import structlog

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

from ..errors import DevicePluginError, PermanentError
from ..handover import Handover, next_change, withhold
from ..inventory import Inventory, View
from ..model import Injection
from ..resources import ResourceNames, Unit, advertise, device_of
from ..topology import preferred, topology
from .assignment import WholeIntent

log = structlog.get_logger(__name__)

#: Allocate's callback: (resource, unit ids per container) → one injection per container.
Allocator = Callable[[str, Sequence[Sequence[str]]], Awaitable[list[Injection]]]
Intent = Callable[[str, Sequence[str], Sequence[str], int], Awaitable[WholeIntent]]
"""(resource, available, must include, size) → the scheduler's decision for those units."""
Observer = Callable[[str, str, float, bool], None]
"""(resource, method, seconds, ok): how the metrics see each call."""


def _units(view: View, names: ResourceNames, resource: str) -> tuple[Unit, ...]:
    return advertise(view.devices, names).get(resource, ())


def list_response(units: Sequence[Unit]) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=u.id,
                health=sockets.HEALTHY if u.healthy else sockets.UNHEALTHY,
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=u.numa_node)])
                if u.numa_node >= 0
                else None,
            )
            for u in units
        ]
    )


def container_response(inj: Injection) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(inj.envs),
        annotations=dict(inj.annotations),
        devices=[
            api_pb2.DeviceSpec(container_path=c, host_path=h, permissions=p)
            for c, h, p in inj.device_nodes
        ],
        mounts=[
            api_pb2.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in inj.mounts
        ],
    )


class DevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """The plugin of one extended resource."""

    def __init__(
        self,
        resource: str,
        inventory: Inventory,
        names: ResourceNames,
        allocator: Allocator,
        observe: Observer | None = None,
        *,
        intent: Intent | None = None,
        withheld: Handover | None = None,
    ) -> None:
        self.resource = resource
        self.withheld = withheld
        self.inventory = inventory
        self.names = names
        self.allocator = allocator
        self.observe = observe or (lambda *_: None)
        # the scheduler places no vfio GPU: topology alone prefers among them
        self.intent = None if resource == names.gpu_vfio else intent
        self.whole = resource in (names.gpu, names.ppu, names.gpu_vfio) or "-mig-" in resource

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self.whole
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        view = self.inventory.view()
        seen = self.withheld.generation if self.withheld is not None else 0
        last: tuple[Unit, ...] | None = None
        while True:
            units = _units(view, self.names, self.resource)
            if self.withheld is not None:
                units = withhold(units, self.withheld.held)
            if units != last:
                # every message carries the full list, as the kubelet replaces its view
                yield list_response(units)
                last = units
            view, seen = await next_change(self.inventory, view, self.withheld, seen)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreferredAllocationResponse:
        """The scheduler's devices when a pod on this node was assigned exactly these units
        (the kubelet picks whole devices itself, from this answer); else the best topology fit,
        leaving out devices the scheduler gave out as shares while enough others are free."""
        start = time.perf_counter()
        topo = topology(self.inventory.view().devices)
        out = []
        for r in request.container_requests:
            available, must = list(r.available_deviceIDs), list(r.must_include_deviceIDs)
            size = r.allocation_size
            decided = None
            if self.intent is not None:
                decided = await self.intent(self.resource, available, must, size)
            if decided is not None and decided.choice is not None:
                ids = list(decided.choice)
            else:
                pool = available
                if decided is not None and decided.reserved:
                    spare = [i for i in available if device_of(i) not in decided.reserved]
                    pool = spare if len(set(spare) | set(must)) >= size else available
                ids = preferred(topo, pool, must, size)
            out.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        self.observe(self.resource, "GetPreferredAllocation", time.perf_counter() - start, True)
        return api_pb2.PreferredAllocationResponse(container_responses=out)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        start = time.perf_counter()
        ids = [list(r.devices_ids) for r in request.container_requests]
        try:
            injections = await self.allocator(self.resource, ids)
        except DevicePluginError as e:
            self.observe(self.resource, "Allocate", time.perf_counter() - start, False)
            log.warning("allocate_failed", resource=self.resource, devices=ids, error=str(e))
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if isinstance(e, PermanentError)
                else grpc.StatusCode.UNAVAILABLE
            )
            await context.abort(code, str(e))
        self.observe(self.resource, "Allocate", time.perf_counter() - start, True)
        return api_pb2.AllocateResponse(
            container_responses=[container_response(i) for i in injections]
        )

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def socket_name(resource: str) -> str:
    """The plugin's socket file name in the kubelet's directory, e.g. lj-aliyun.com-gpu.sock."""
    return "lj-" + resource.replace("/", "-") + ".sock"


def create_server(address: str, plugin: DevicePlugin) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(address)
    return server


async def register(kubelet_socket: str, plugin: DevicePlugin, endpoint: str, wait_s: float) -> None:
    """Register one plugin with the kubelet (after its socket serves)."""
    async with grpc.aio.insecure_channel(sockets.unix_target(kubelet_socket)) as ch:
        stub = api_pb2_grpc.RegistrationStub(ch)
        await stub.Register(
            api_pb2.RegisterRequest(
                version=sockets.DEVICE_PLUGIN_API_VERSION,
                endpoint=endpoint,
                resource_name=plugin.resource,
                options=api_pb2.DevicePluginOptions(
                    get_preferred_allocation_available=plugin.whole
                ),
            ),
            timeout=wait_s,
        )
