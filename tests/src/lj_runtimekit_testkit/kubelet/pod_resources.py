"""The kubelet's pod-resources API v1 (``<root>/pod-resources/kubelet.sock``), as the kubelet
serves it (pkg/kubelet/apis/podresources/server_v1.go, Kubernetes 1.37):

- ``List``: every *active* pod the kubelet knows (admitted, not terminal, not deleted with its
  containers stopped), each with all its containers (restartable init containers first), even
  containers without devices; per container the devices per resource, with NUMA topology.
  Devices appear only once the plugin's Allocate has returned (the device manager records the
  response, then the pod-resources view reads it).
- ``Get``: the same for one pod; an unknown or inactive pod fails with the kubelet's message
  ``pod <name> in namespace <namespace> not found``. The kubelet returns a plain Go error there,
  which grpc-go sends as status UNKNOWN (not NOT_FOUND); clients must match on the message.
- ``GetAllocatableResources``: the healthy devices of every registered resource.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from lj_runtimekit_interface.podresources.v1 import api_pb2 as pb
from lj_runtimekit_interface.podresources.v1 import api_pb2_grpc as pbgrpc
from lj_runtimekit_interface.sockets import unix_target

SOCKET = "kubelet.sock"


@dataclass(frozen=True)
class Held:
    """Devices the device manager recorded for one container."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Snapshot:
    """What the pod-resources server reads at one call."""

    pods: Sequence[Mapping[str, Any]]
    """Active pods as API JSON."""
    held: Sequence[Held]
    numa: Mapping[str, Mapping[str, int]]
    """resource → device ID → NUMA node (-1: none), of every device a plugin advertises."""
    healthy: frozenset[tuple[str, str]] = frozenset()
    """(resource, device ID) of the healthy devices: GetAllocatableResources lists only these."""


Source = Callable[[], Snapshot]


def _topology(numa: int) -> pb.TopologyInfo | None:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa >= 0 else None


def _devices(snap: Snapshot, uid: str, container: str) -> list[pb.ContainerDevices]:
    # One entry per device ID (and NUMA node), as containerDevicesFromResourceDeviceInstances
    out = []
    for h in snap.held:
        if h.pod_uid != uid or h.container != container:
            continue
        numa = snap.numa.get(h.resource, {})
        for d in sorted(h.device_ids):
            out.append(
                pb.ContainerDevices(
                    resource_name=h.resource, device_ids=[d], topology=_topology(numa.get(d, -1))
                )
            )
    return out


def _containers(pod: Mapping[str, Any]) -> Iterable[str]:
    spec = pod.get("spec") or {}
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":  # sidecars only, as the kubelet
            yield c["name"]
    for c in spec.get("containers") or []:
        yield c["name"]


def pod_resources(snap: Snapshot, pod: Mapping[str, Any]) -> pb.PodResources:
    meta = pod["metadata"]
    return pb.PodResources(
        name=meta["name"],
        namespace=meta["namespace"],
        containers=[
            pb.ContainerResources(name=c, devices=_devices(snap, meta["uid"], c))
            for c in _containers(pod)
        ],
    )


class PodResourcesServicer(pbgrpc.PodResourcesListerServicer):
    def __init__(self, source: Source) -> None:
        self.source = source
        self.calls: dict[str, int] = {}

    def _count(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1

    async def List(
        self, request: pb.ListPodResourcesRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ListPodResourcesResponse:
        self._count("List")
        snap = self.source()
        return pb.ListPodResourcesResponse(
            pod_resources=[pod_resources(snap, p) for p in snap.pods]
        )

    async def Get(
        self, request: pb.GetPodResourcesRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.GetPodResourcesResponse:
        self._count("Get")
        snap = self.source()
        for p in snap.pods:
            meta = p["metadata"]
            if (meta["namespace"], meta["name"]) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=pod_resources(snap, p))
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.AllocatableResourcesResponse:
        self._count("GetAllocatableResources")
        snap = self.source()
        out = []
        for resource, numa in sorted(snap.numa.items()):
            for d, node in sorted(numa.items()):
                if (resource, d) not in snap.healthy:
                    continue
                out.append(
                    pb.ContainerDevices(
                        resource_name=resource, device_ids=[d], topology=_topology(node)
                    )
                )
        return pb.AllocatableResourcesResponse(devices=out)


class PodResourcesServer:
    """Serves :class:`PodResourcesServicer` on ``<directory>/kubelet.sock``."""

    def __init__(self, directory: str, source: Source) -> None:
        self.directory = directory
        self.servicer = PodResourcesServicer(source)
        self._server: aio.Server | None = None

    @property
    def socket_path(self) -> str:
        return os.path.join(self.directory, SOCKET)

    async def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = aio.server()
        pbgrpc.add_PodResourcesListerServicer_to_server(self.servicer, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
