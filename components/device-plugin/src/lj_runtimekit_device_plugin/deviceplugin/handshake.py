"""The shared-GPU handshake at Allocate (docs/contracts.md), with its I/O.

Race-free without a node lock: the candidate is the unique one :func:`assignment.unique` finds; a
(pod, container, resource) is claimed in this process before any await (asyncio runs one claim
at a time), and the pod mark is written from a fresh read with its resourceVersion, so a second
replica or a stale pod view loses with 409 and moves on to the next candidate.

A container asking both ``gpu-core`` and ``gpu-memory`` gets two Allocate calls from the kubelet,
one per resource. The first allocates its whole share (core and memory) in the Runtime; the
second is answered with that same allocation, so both carry one identical injection and the
kubelet's first-wins merge of environments never sees two values for one key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence

import structlog

from ..errors import DevicePluginError, PermanentError
from ..kube import Conflict, MarkUpdate
from ..model import GIB, Allocation, Device, Injection
from ..pod_events import EventPoster, PodEvents
from ..podview import PodView
from ..resources import ResourceNames
from ..runtime import RuntimeClient, allocations, release
from .allocate import RoomMaker, SharedAllocator, allocate_making_room
from .assignment import (
    Candidate,
    Share,
    WholeIntent,
    WholePending,
    candidates,
    refusals,
    unique,
    whole_intent,
    with_mark,
)
from .headroom import share_error

log = structlog.get_logger(__name__)

PodLister = Callable[[], Awaitable[list[PodView]]]
PodMarker = Callable[[PodView, MarkUpdate], Awaitable[None]]


class NoDecision(PermanentError):
    """No pod on this node carries an unanswered decision for this request."""


class _Refused(PermanentError):
    """Refused with its own Event already on the pod."""


def merged(allocs: Sequence[Allocation]) -> Injection:
    """One container's injection from the Runtime allocations of its devices."""
    envs: dict[str, str] = {}
    annotations: dict[str, str] = {}
    nodes: list[tuple[str, str, str]] = []
    mounts: list[tuple[str, str, bool]] = []
    for a in allocs:
        envs.update(a.injection.envs)
        annotations.update(a.injection.annotations)
        nodes += [n for n in a.injection.device_nodes if n not in nodes]
        mounts += [m for m in a.injection.mounts if m not in mounts]
    return Injection(
        tuple(sorted(envs.items())),
        tuple(sorted(annotations.items())),
        tuple(nodes),
        tuple(mounts),
    )


class SharedHandshake(SharedAllocator):
    def __init__(
        self,
        client: RuntimeClient,
        names: ResourceNames,
        node: str,
        list_pods: PodLister,
        mark_pod: PodMarker,
        *,
        post_event: EventPoster | None = None,
        events: PodEvents | None = None,
        room: RoomMaker | None = None,
        devices: Callable[[], Sequence[Device]] | None = None,
    ) -> None:
        self.devices = devices
        """This node's known devices, to check a share fits before asking the Runtime."""
        self.room = room
        self.events = events or PodEvents(post_event)
        """Warning Events on refused pods, one per pod and reason per window."""
        self.client = client
        self.names = names
        self.node = node
        self.list_pods = list_pods
        self.mark_pod = mark_pod
        self._claimed: set[tuple[str, str, str]] = set()
        """(pod uid, container, resource) answered or being answered by this process."""
        self._held: dict[tuple[str, str], tuple[str, ...]] = {}
        """(pod uid, container) → its Runtime allocation ids, once answered here."""
        self._injections: dict[tuple[str, ...], Injection] = {}

    def _kind(self, resource: str) -> str:
        return "gpu-core" if resource == self.names.gpu_core else "gpu-memory"

    def _forget_gone(self, pods: Sequence[PodView]) -> None:
        live = {p.uid for p in pods}
        self._claimed = {k for k in self._claimed if k[0] in live}
        for key in [k for k in self._held if k[0] not in live]:
            self._injections.pop(self._held.pop(key), None)

    async def intent(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> WholeIntent:
        """The scheduler's decision for a whole-device request (GetPreferredAllocation)."""
        pods = await self.list_pods()
        intent = whole_intent(
            pods, self.node, resource, size=size, available=available, must_include=must_include
        )
        if intent.ambiguous:
            names = ", ".join(f"{p.namespace}/{p.name}[{c}]" for p, c in intent.ambiguous)
            await self.warn(
                [p for p, _ in intent.ambiguous],
                "AmbiguousGpuAssignment",
                f"{len(intent.ambiguous)} pending containers on node {self.node} ask {size} "
                f"{resource} ({names}); the kubelet's request names no pod, so the devices are "
                "chosen by topology and recorded on the pod after Allocate",
            )
        return intent

    async def warn(self, pods: Sequence[PodView], reason: str, message: str) -> None:
        """A Warning Event on each pod, at most one per pod and reason per window."""
        await self.events.warn(pods, reason, message)

    async def mark_whole(
        self, owner: WholePending, resource: str, allocation_id: str, device_ids: Sequence[str]
    ) -> None:
        """Record the allocation and the devices the kubelet really gave on the pod; an Event
        when they are not the scheduler's."""
        at = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
        got = tuple(sorted(device_ids))

        def update(annotations: Mapping[str, str]) -> dict[str, str] | None:
            return with_mark(
                annotations, at, owner.container, resource, (allocation_id,), devices=got
            )

        try:
            await self.mark_pod(owner.pod, update)
        except (Conflict, DevicePluginError) as e:
            log.warning(
                "whole_mark_failed",
                pod=f"{owner.pod.namespace}/{owner.pod.name}",
                error=str(e),
                effect="the scheduler learns the devices from NodeDevices/pod-resources later",
            )
        if owner.devices and owner.devices != got:
            await self.warn(
                [owner.pod],
                "GpuAssignmentNotFollowed",
                f"container {owner.container}: the kubelet gave {list(got)} of {resource}, the "
                f"scheduler assigned {list(owner.devices)}; the container got what the kubelet "
                "gave (recorded in lj-runtimekit-device-plugin/allocation)",
            )

    async def allocate(self, resource: str, units: Sequence[str]) -> Injection:
        kind = self._kind(resource)
        pods: list[PodView] = []
        for _ in range(5):
            pods = await self.list_pods()
            self._forget_gone(pods)
            found = candidates(
                pods,
                self.node,
                resource,
                kind,
                units=len(units),
                claimed=self._claimed,
                held=self._held,
                paid=self._paid,
            )
            c, ambiguous = unique(found)
            if c is None and ambiguous:
                names = ", ".join(
                    f"{a.pod.namespace}/{a.pod.name}[{a.container}]" for a in ambiguous
                )
                message = (
                    f"{resource}: {len(ambiguous)} pending containers on node {self.node} ask "
                    f"{len(units)} units ({names}); the kubelet names no pod, so the plugin "
                    "cannot tell whose decision this is and refuses rather than guess; the "
                    "scheduler keeps such requests apart (docs/contracts.md): was a pod bound "
                    "by another client?"
                )
                await self.warn([a.pod for a in ambiguous], "AmbiguousGpuAssignment", message)
                raise NoDecision(message)
            if c is None:
                break
            key = (c.pod.uid, c.container, resource)
            self._claimed.add(key)  # before any await: no other Allocate here takes it
            try:
                return await self._claim(resource, c)
            except Conflict as e:
                # claimed elsewhere or changed: read again, the mark filters it
                log.info("pod_claim_lost", pod=f"{c.pod.namespace}/{c.pod.name}", error=str(e))
                self._claimed.discard(key)
            except DevicePluginError as e:
                self._claimed.discard(key)
                if not isinstance(e, NoDecision | _Refused):
                    await self.warn([c.pod], "GpuAllocationFailed", f"{resource}: {e}")
                raise
            except BaseException:
                self._claimed.discard(key)
                raise
        refused = refusals(pods, self.node, resource, kind, units=len(units), paid=self._paid)
        for pod, why in refused:
            await self.warn([pod], "GpuAssignmentRefused", why)
        because = "".join(f"; {p.namespace}/{p.name}: {why}" for p, why in refused[:3])
        raise NoDecision(
            f"{resource}: no pod on node {self.node} has an unanswered "
            f"lj-runtimekit-scheduler/gpu-assignment for {len(units)} units; was the pod "
            f"scheduled by lj-runtimekit-scheduler?{because}"
        )

    @property
    def _paid(self) -> dict[str, str]:
        return {"gpu-core": self.names.gpu_core, "gpu-memory": self.names.gpu_memory}

    async def _claim(self, resource: str, c: Candidate) -> Injection:
        pod = (c.pod.namespace, c.pod.name, c.pod.uid)
        fresh: list[Allocation] = []
        try:
            if c.allocated:
                ids = c.allocated
                injection = await self._injection_of(ids, c)
            else:
                await self._check_room(resource, c)
                for share in c.shares:
                    fresh.append(
                        await allocate_making_room(
                            self.client,
                            self.room,
                            pod=pod,
                            container=c.container,
                            resource=resource,
                            device_ids=[share.id],
                            core_percent=share.core,
                            memory_bytes=share.memory_gib * GIB,
                        )
                    )
                ids = tuple(a.id for a in fresh)
                injection = merged(fresh)
            at = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")

            devices = tuple(sh.id for sh in c.shares)

            def update(annotations: Mapping[str, str]) -> dict[str, str] | None:
                return with_mark(annotations, at, c.container, resource, ids, devices=devices)

            await self.mark_pod(c.pod, update)
        except BaseException:
            for a in fresh:
                await release(self.client, a.id)
            raise
        self._held[(c.pod.uid, c.container)] = ids
        self._injections[ids] = injection
        log.info(
            "shared_allocated",
            pod=f"{c.pod.namespace}/{c.pod.name}",
            container=c.container,
            devices=[s.id for s in c.shares],
            resource=resource,
            allocations=list(ids),
            reused=bool(c.allocated),
        )
        return injection

    async def _check_room(self, resource: str, c: Candidate) -> None:
        """Refuse a share the device cannot take (see :mod:`headroom`), after one prompt
        reconcile pass (containers that are gone may still hold it)."""
        if self.devices is None:
            return
        error = None
        for attempt in (1, 2):
            live = await allocations(self.client)
            inventory = {d.id: d for d in self.devices()}
            given: list[Share] = []
            for share in c.shares:
                error = share_error(share, inventory, live, also=given)
                if error:
                    break
                given.append(share)
            if error is None:
                return
            if attempt == 1 and self.room is not None:
                await self.room.prompt()
                continue
            break
        message = (
            f"{resource}: container {c.container}: the pod's lj-runtimekit-scheduler/"
            f"gpu-assignment cannot be followed: {error}; refused rather than over-commit the "
            "device (was the annotation written by someone other than the scheduler?)"
        )
        await self.warn([c.pod], "GpuAssignmentRefused", message)
        raise _Refused(message)

    async def _injection_of(self, ids: tuple[str, ...], c: Candidate) -> Injection:
        """The injection of the allocations this container already holds.

        The ids may come from the pod's own allocation mark, which the pod's owner can write:
        each must be a live Runtime allocation recorded for this very pod and container, or a
        forged mark naming another pod's allocation would hand over that pod's device share
        without a new allocation (two containers on one share: an over-commit)."""
        if self._held.get((c.pod.uid, c.container)) == ids and ids in self._injections:
            return self._injections[ids]
        live = {a.id: a for a in await allocations(self.client)}
        missing = [i for i in ids if i not in live]
        if missing:
            raise PermanentError(
                f"the container's Runtime allocations {missing} are gone (released by a "
                "Runtime restart?); delete the pod so it is scheduled and allocated afresh"
            )
        foreign = [
            i for i in ids if (live[i].pod[2], live[i].container) != (c.pod.uid, c.container)
        ]
        if foreign:
            message = (
                f"container {c.container}: the pod's lj-runtimekit-device-plugin/allocation "
                f"names Runtime allocations {foreign} that belong to another container; refused "
                "(that annotation is the device plugin's to write)"
            )
            await self.warn([c.pod], "GpuAllocationMarkRefused", message)
            raise _Refused(message)
        return merged([live[i] for i in ids])
