"""A kubelet for one node, as far as device plugins and their pods are concerned.

It serves Registration on ``<plugin_dir>/kubelet.sock``, dials each registered plugin, follows its
ListAndWatch, publishes node capacity/allocatable (when a cluster is given), allocates devices to
containers of pods bound to its node, serves ``/pods`` and the pod-resources API
(``<root>/pod-resources/kubelet.sock``), and restarts the way the kubelet does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from grpc import aio

from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.sockets import KUBELET_SOCKET, unix_target
from lj_runtimekit_testkit.kubelet.allocation import available_ids, choose
from lj_runtimekit_testkit.kubelet.endpoint import PluginEndpoint
from lj_runtimekit_testkit.kubelet.node_status import NodeStatusWriter
from lj_runtimekit_testkit.kubelet.pod_resources import Held, PodResourcesServer, Snapshot
from lj_runtimekit_testkit.kubelet.pods_server import PodsServer
from lj_runtimekit_testkit.kubelet.registration import RegistrationServicer

if TYPE_CHECKING:
    from lj_runtimekit_testkit.cluster.handle import Cluster

log = structlog.get_logger(__name__)

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
_TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class AllocationRecord:
    """One Allocate call: for which pod/container (None when on demand), which IDs, the answer."""

    resource: str
    device_ids: tuple[str, ...]
    response: api_pb2.ContainerAllocateResponse
    pod_uid: str | None = None
    pod: str | None = None
    container: str | None = None
    pre_started: bool = False


class KubeletEmulator:
    """The device-plugin side of a kubelet for ``node_name``, on ``plugin_dir``."""

    def __init__(
        self,
        node_name: str,
        plugin_dir: str | Path,
        cluster: Cluster | None = None,
        *,
        pods_port: int = 0,
        stop_grace_s: float = 5.0,
        poll_interval_s: float = 0.2,
        pod_resources_dir: str | Path | None = None,
    ) -> None:
        self.node_name = node_name
        self.plugin_dir = str(plugin_dir)
        if pod_resources_dir is None:
            # the kubelet's layout: <root>/device-plugins beside <root>/pod-resources
            parent, base = os.path.split(self.plugin_dir.rstrip("/"))
            pod_resources_dir = (
                os.path.join(parent, "pod-resources")
                if base == "device-plugins"
                else os.path.join(self.plugin_dir, "pod-resources")
            )
        self.pod_resources = PodResourcesServer(str(pod_resources_dir), self.pod_resources_snapshot)
        self.cluster = cluster
        self.stop_grace_s = stop_grace_s
        self.poll_interval_s = poll_interval_s
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.allocations: list[AllocationRecord] = []
        self.failures: list[tuple[str, str, str, str]] = []
        """(pod uid, container, resource, error) of every failed admission allocation."""
        self.registrations = 0
        self._pods: list[dict[str, Any]] = []
        self._pods_server = PodsServer(lambda: self._pods, port=pods_port)
        self._server: aio.Server | None = None
        self._servicer: RegistrationServicer | None = None
        self._last_total: dict[str, int] = {}
        self._lost_at: dict[str, float] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._api: Any = None
        self._status: NodeStatusWriter | None = None

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)

    @property
    def pod_resources_socket(self) -> str:
        return self.pod_resources.socket_path

    def pod_resources_snapshot(self) -> Snapshot:
        """What the pod-resources API answers now: active pods, and the devices recorded for
        their containers (only after the plugin's Allocate returned)."""
        pods = [p for p in self._pods if _is_live(p)]
        live = {p["metadata"]["uid"] for p in pods}
        held = [
            Held(r.pod_uid, r.container, r.resource, r.device_ids)
            for r in self.allocations
            if r.pod_uid is not None and r.pod_uid in live and r.container is not None
        ]
        numa = {r: dict(e.numa) for r, e in self.endpoints.items()}
        healthy = frozenset((r, d) for r, e in self.endpoints.items() for d in e.healthy())
        return Snapshot(pods, held, numa, healthy)

    @property
    def pods_url(self) -> str:
        return self._pods_server.url

    @property
    def servicer(self) -> RegistrationServicer:
        assert self._servicer is not None, "emulator not started"
        return self._servicer

    async def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        await self._pods_server.start()
        if self.cluster is not None:
            self._api = self.cluster.api_client()
            self._status = NodeStatusWriter(self._api, self.node_name)
            self._spawn(self._status_loop(), "node-status")
            self._spawn(self._pods_loop(), "pods")
        await self._serve_registration()
        await self.pod_resources.start()
        log.info("kubelet_emulator_started", node=self.node_name, socket=self.socket_path)

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"kubelet:{name}"))

    async def _serve_registration(self) -> None:
        self._servicer = RegistrationServicer(self.plugin_dir, self._on_register)
        server = aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self._servicer, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server

    async def _on_register(self, request: api_pb2.RegisterRequest) -> None:
        old = self.endpoints.pop(request.resource_name, None)
        if old is not None:
            await old.stop()
        endpoint = PluginEndpoint(
            request.resource_name,
            os.path.join(self.plugin_dir, request.endpoint),
            self._on_devices,
        )
        await endpoint.start()
        self.endpoints[request.resource_name] = endpoint
        self.registrations += 1

    def _on_devices(self, endpoint: PluginEndpoint) -> None:
        if self.endpoints.get(endpoint.resource, endpoint) is not endpoint:
            return  # a replaced endpoint's stream ending says nothing about the resource
        if endpoint.connected:
            self._lost_at.pop(endpoint.resource, None)
            self._last_total[endpoint.resource] = len(endpoint.devices)
        else:
            # As the kubelet: devices of a lost plugin are unhealthy at once, and the resource
            # leaves capacity when the plugin has not come back within the grace period.
            self._lost_at[endpoint.resource] = time.monotonic()
            asyncio.get_running_loop().call_later(self.stop_grace_s + 0.05, self._dirty.set)
        self._dirty.set()

    def resources(self) -> dict[str, tuple[int, int]]:
        """resource → (capacity, allocatable) as the kubelet would publish them now."""
        out: dict[str, tuple[int, int]] = {}
        now = time.monotonic()
        for resource, total in self._last_total.items():
            endpoint = self.endpoints.get(resource)
            if endpoint is not None and endpoint.connected:
                out[resource] = (len(endpoint.devices), len(endpoint.healthy()))
            elif now - self._lost_at.get(resource, now) >= self.stop_grace_s:
                out[resource] = (0, 0)
            else:
                out[resource] = (total, 0)
        return out

    async def _status_loop(self) -> None:
        assert self._status is not None
        published: dict[str, tuple[int, int]] = {}
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            for resource, value in self.resources().items():
                if published.get(resource) != value:
                    await self._status.set_resource(resource, *value)
                    published[resource] = value

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID → health of the plugin registered for ``resource`` (empty when none)."""
        endpoint = self.endpoints.get(resource)
        return dict(endpoint.devices) if endpoint else {}

    def _in_use(self, resource: str) -> set[str]:
        live = {p["metadata"]["uid"] for p in self._pods if _is_live(p)}
        return {
            d
            for r in self.allocations
            if r.resource == resource and (r.pod_uid is None or r.pod_uid in live)
            for d in r.device_ids
        }

    async def choose_devices(self, resource: str, count: int) -> list[str]:
        """Healthy, free unit IDs for a container, the plugin's preference asked first."""
        endpoint = self._endpoint(resource)
        available = available_ids(endpoint.healthy(), self._in_use(resource))
        preferred: list[str] | None = None
        if endpoint.options.get_preferred_allocation_available and count < len(available):
            request = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, allocation_size=count
                    )
                ]
            )
            response = await endpoint.stub.GetPreferredAllocation(request, timeout=10)
            preferred = list(response.container_responses[0].deviceIDs)
        return choose(available, count, preferred)

    def _endpoint(self, resource: str) -> PluginEndpoint:
        endpoint = self.endpoints.get(resource)
        if endpoint is None or not endpoint.connected:
            raise LookupError(f"no device plugin registered for {resource} on {self.node_name}")
        return endpoint

    async def allocate(
        self,
        resource: str,
        device_ids: list[str],
        *,
        pod: dict[str, Any] | None = None,
        container: str | None = None,
    ) -> api_pb2.ContainerAllocateResponse:
        """Allocate (then PreStartContainer when the plugin asks for it), and record the call."""
        endpoint = self._endpoint(resource)
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)]
        )
        response = (await endpoint.stub.Allocate(request, timeout=10)).container_responses[0]
        pre_started = endpoint.options.pre_start_required
        if pre_started:
            await endpoint.stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=device_ids), timeout=10
            )
        meta = (pod or {}).get("metadata", {})
        self.allocations.append(
            AllocationRecord(
                resource,
                tuple(device_ids),
                response,
                pod_uid=meta.get("uid"),
                pod=f"{meta['namespace']}/{meta['name']}" if meta else None,
                container=container,
                pre_started=pre_started,
            )
        )
        log.info(
            "devices_allocated",
            node=self.node_name,
            resource=resource,
            ids=device_ids,
            pod=meta.get("name"),
            container=container,
        )
        return response

    def set_pods(self, pods: list[dict[str, Any]]) -> None:
        """Without a cluster: the pods ``/pods`` answers with."""
        self._pods = list(pods)

    async def _pods_loop(self) -> None:
        assert self._status is not None
        while True:
            self._pods = await self._status.bound_pods()
            for pod in self._pods:
                if _is_live(pod):
                    await self._admit(pod)
            await asyncio.sleep(self.poll_interval_s)

    async def admit(self, pod: dict[str, Any]) -> None:
        """Allocate every device resource of the pod's containers not allocated yet, as the
        kubelet's admission does (one container after another, its resources in a row)."""
        await self._admit(pod)

    async def _admit(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        for container in pod["spec"].get("containers", []):
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource, quantity in limits.items():
                if resource not in self.endpoints or self._allocated(
                    uid, container["name"], resource
                ):
                    continue
                try:
                    ids = await self.choose_devices(resource, int(quantity))
                    await self.allocate(resource, ids, pod=pod, container=container["name"])
                except (LookupError, ValueError, aio.AioRpcError) as e:
                    self.failures.append((uid, container["name"], resource, str(e)))
                    log.warning(
                        "allocation_failed",
                        pod=pod["metadata"]["name"],
                        resource=resource,
                        error=str(e),
                    )

    def _allocated(self, uid: str, container: str, resource: str) -> bool:
        return any(
            r.pod_uid == uid and r.container == container and r.resource == resource
            for r in self.allocations
        )

    async def restart(self) -> None:
        """As a kubelet restart: connections drop, every socket in the directory is removed,
        ``kubelet.sock`` comes back, and plugins must register again."""
        await self._stop_registration()
        await self.pod_resources.stop()
        for endpoint in list(self.endpoints.values()):
            await endpoint.stop()
            self._on_devices(endpoint)
        self.endpoints.clear()
        for entry in os.scandir(self.plugin_dir):
            if entry.name != CHECKPOINT_FILE and not entry.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        await self._serve_registration()
        await self.pod_resources.start()
        log.info("kubelet_emulator_restarted", node=self.node_name)

    async def _stop_registration(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._stop_registration()
        await self.pod_resources.stop()
        for endpoint in list(self.endpoints.values()):
            await endpoint.stop()
        self.endpoints.clear()
        await self._pods_server.stop()
        if self._api is not None:
            self._api.close()
            self._api = None


def _is_live(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL and not pod["metadata"].get(
        "deletionTimestamp"
    )
