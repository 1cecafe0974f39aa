"""Allocate: the Runtime's injection for whole devices and partitions; the inventory's for GPUs
bound to vfio-pci (:mod:`vfio`: the Runtime allocates nothing on them).

Shared ``gpu-core``/``gpu-memory`` need the scheduler's decision on the pod (the handshake of
docs/contracts.md, see :mod:`assignment`); without a pod source this refuses them clearly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog

from ..errors import DevicePluginError, PermanentError, TemporaryError
from ..model import Allocation, Device, Injection
from ..podview import PodView
from ..reconcile import PROVISIONAL_NAMESPACE, stale_whole
from ..resources import ResourceNames
from ..runtime import AllocationRefused, RuntimeClient, allocations, release
from . import vfio
from .assignment import WholeIntent, WholePending, whole_owner

log = structlog.get_logger(__name__)

UNATTRIBUTED_NAMESPACE = PROVISIONAL_NAMESPACE
StaleReleaser = Callable[[list[Allocation], str], Awaitable[None]]
"""(allocations of gone containers, resource): release them, with logs and metrics."""
InjectionCheck = Callable[[str, Injection], None]
PodLister = Callable[[], Awaitable[list[PodView]]]
DeviceSource = Callable[[], Sequence[Device]]
"""The node's devices as last listed by the Runtime (the inventory)."""


class RoomMaker(Protocol):
    """Frees what gone containers still hold (a prompt reconcile pass)."""

    async def prompt(self) -> object: ...


class AllocateTimeout(TemporaryError):
    """Allocate ran past its own bound (the kubelet gives none)."""


NO_INTENT = WholeIntent(None, frozenset())


class SharedAllocator:
    """Hook for the scheduler handshake; without a pod source shared requests are refused and
    whole devices are chosen by topology alone."""

    async def intent(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> WholeIntent:
        return NO_INTENT

    async def mark_whole(
        self, owner: WholePending, resource: str, allocation_id: str, device_ids: Sequence[str]
    ) -> None:
        return None

    async def warn(self, pods: Sequence[PodView], reason: str, message: str) -> None:
        """A Warning Event on each pod; here (no apiserver) only the log line."""
        log.warning(
            "pod_warning",
            reason=reason,
            pods=[f"{p.namespace}/{p.name}" for p in pods],
            message=message,
        )

    async def allocate(self, resource: str, units: Sequence[str]) -> Injection:
        raise PermanentError(
            f"{resource}: shared allocation needs the scheduler's decision on the pod "
            "(lj-runtimekit-scheduler/gpu-assignment); no pod source is configured"
        )


class Allocator:
    """(resource, unit ids per container) → one Injection per container, bounded in time."""

    def __init__(
        self,
        client: RuntimeClient,
        names: ResourceNames,
        timeout_s: float,
        shared: SharedAllocator | None = None,
        *,
        release_stale: StaleReleaser | None = None,
        check: InjectionCheck | None = None,
        pods: PodLister | None = None,
        node: str = "",
        room: RoomMaker | None = None,
        devices: DeviceSource | None = None,
    ) -> None:
        self.room = room
        self.devices = devices or (lambda: ())
        self.pods = pods
        self.node = node
        self.release_stale = release_stale
        self.check = check or (lambda *_: None)
        self.client = client
        self.names = names
        self.timeout_s = timeout_s
        self.shared = shared or SharedAllocator()

    async def intent(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> WholeIntent:
        """What the scheduler decided for this whole-device request; no decision when the pod
        source fails or is slow (the kubelet waits on GetPreferredAllocation)."""
        try:
            async with asyncio.timeout(min(self.timeout_s, 2.0)):
                return await self.shared.intent(resource, available, must_include, size)
        except (TimeoutError, DevicePluginError) as e:
            log.warning("preferred_without_decision", resource=resource, error=str(e) or "timeout")
            return NO_INTENT

    async def __call__(self, resource: str, containers: Sequence[Sequence[str]]) -> list[Injection]:
        try:
            async with asyncio.timeout(self.timeout_s):
                return [await self._one(resource, ids) for ids in containers]
        except TimeoutError as e:
            raise AllocateTimeout(
                f"Allocate of {resource} took more than {self.timeout_s}s: is the Runtime slow "
                "or upgrading? Running containers are not affected."
            ) from e

    async def _one(self, resource: str, ids: Sequence[str]) -> Injection:
        if not ids:
            return Injection()
        if resource == self.names.gpu_vfio:
            injection = vfio.injection(resource, self.devices(), ids)
            log.info("allocated_vfio", resource=resource, devices=list(ids))
        elif resource in (self.names.gpu_core, self.names.gpu_memory):
            injection = await self.shared.allocate(resource, ids)
        else:
            injection = await self._whole(resource, sorted(set(ids)))
        self.check(resource, injection)
        return injection

    async def _whole(self, resource: str, devices: list[str]) -> Injection:
        found: list[WholePending] = []
        try:
            return await self._whole_for(resource, devices, found)
        except DevicePluginError as e:
            owner = found[0] if found else await self._owner(resource, devices, set())
            if owner is not None:
                await self.shared.warn(
                    [owner.pod],
                    "GpuAllocationFailed",
                    f"{resource}: container {owner.container}: devices {devices}: {e}",
                )
            raise

    async def _whole_for(
        self, resource: str, devices: list[str], found: list[WholePending]
    ) -> Injection:
        """The whole-device allocation; the owner, once known, is put in ``found``."""
        live = await allocations(self.client)
        # The kubelet never hands a live container's device to another: a Runtime allocation
        # still holding one of these belongs to a container that is gone.
        stale = stale_whole(live, resource, devices)
        if stale:
            if self.release_stale is not None:
                await self.release_stale(stale, resource)
            else:
                for a in stale:
                    await release(self.client, a.id)
        owned = {(a.pod[2], a.container) for a in live if a.resource == resource and a not in stale}
        owner = await self._owner(resource, devices, owned)
        if owner is not None:
            found.append(owner)
            pod = (owner.pod.namespace, owner.pod.name, owner.pod.uid)
            container = owner.container
        else:
            # pod-resources names the container once the kubelet recorded it; reconcile re-owns
            pod = (PROVISIONAL_NAMESPACE, "whole-" + "-".join(devices), uuid.uuid4().hex)
            container = "unknown"
        alloc = await allocate_making_room(
            self.client,
            self.room,
            pod=pod,
            container=container,
            resource=resource,
            device_ids=devices,
        )
        log.info(
            "allocated",
            resource=resource,
            devices=devices,
            allocation=alloc.id,
            pod=f"{pod[0]}/{pod[1]}",
            container=container,
            released_first=[a.id for a in stale],
        )
        if owner is not None:
            await self.shared.mark_whole(owner, resource, alloc.id, devices)
        return alloc.injection

    async def _owner(
        self, resource: str, devices: list[str], owned: set[tuple[str, str]]
    ) -> WholePending | None:
        if self.pods is None:
            return None
        try:
            async with asyncio.timeout(min(self.timeout_s / 2, 2.0)):
                pods = await self.pods()
        except (TimeoutError, DevicePluginError) as e:
            log.warning("whole_owner_unknown", resource=resource, error=str(e) or "timeout")
            return None
        owner, ambiguous = whole_owner(pods, self.node, resource, devices, owned)
        if owner is None and ambiguous:
            log.info(
                "whole_owner_ambiguous",
                resource=resource,
                devices=devices,
                candidates=[f"{w.pod.namespace}/{w.pod.name}[{w.container}]" for w in ambiguous],
                next="provisional owner; pod-resources re-owns it",
            )
        return owner


async def allocate_making_room(
    client: RuntimeClient,
    room: RoomMaker | None,
    *,
    pod: tuple[str, str, str],
    container: str,
    resource: str,
    device_ids: list[str],
    core_percent: int = 0,
    memory_bytes: int = 0,
) -> Allocation:
    """The Runtime's Allocate; when it refuses for lack of room, one prompt reconcile pass
    (containers that are gone still hold it) and one more try."""
    for attempt in (1, 2):
        try:
            alloc = await client.allocate(
                pod=pod,
                container=container,
                resource=resource,
                device_ids=device_ids,
                core_percent=core_percent,
                memory_bytes=memory_bytes,
            )
        except AllocationRefused as e:
            if room is None or attempt == 2:
                raise
            log.info("allocate_refused_reconciling", resource=resource, error=str(e))
            await room.prompt()
            continue
        return alloc
    raise AssertionError("unreachable")
