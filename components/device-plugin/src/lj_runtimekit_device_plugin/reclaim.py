"""Keeps the Runtime's allocations equal to what live containers hold (with its I/O).

One pass: the Runtime's ListAllocations (our resources only), the kubelet's pod-resources List
and, when a pod source is configured, the pods on the node; :func:`reconcile.decide` says what no
live container holds; that is released through the Runtime's Release, and provisional owners are
replaced by the real ones (``DeviceService.UpdateAllocationOwner``). A pass where any of them
does not answer decides nothing. Passes run on start, after every reconnect to the Runtime or
the kubelet (:meth:`Reclaimer.wake`), and every ``interval_s``.

On a node that has run in DRA mode, the allocations of the claims the DRA checkpoint holds are
never this module's business (pod-resources lists their devices under ``dynamic_resources``, and
the kubelet's ``NodeUnprepareResources`` releases them): ``claimed`` says which they are, read
while no prepare or unprepare runs, and ``on_listed`` learns each pass's :class:`Split` (what
the node's other mode holds, :mod:`.handover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace

import structlog

from .errors import TemporaryError
from .handover import Split, split
from .kubelet import PodResourcesClient
from .metrics import PluginMetrics
from .model import Allocation
from .reconcile import Decision, Memory, PodState, decide
from .runtime import (
    UPDATE_OWNER,
    AllocationRefused,
    MethodMissing,
    RuntimeClient,
    allocations,
    release,
    update_owner,
)

log = structlog.get_logger(__name__)

PodStates = Callable[[], Awaitable[list[PodState] | None]]
"""The pods on the node; None when unknown this time (the pass goes on without them)."""
Claimed = Callable[[], AbstractAsyncContextManager[frozenset[str]]]
"""The allocation ids of the prepared DRA claims, with no prepare or unprepare running inside."""
Listed = Callable[[Split], Awaitable[None]]


@dataclass(frozen=True)
class PassResult:
    """What one pass did; ``skipped`` says why it decided nothing."""

    released: tuple[str, ...] = ()
    reowned: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    skipped: str = ""
    seconds: float = 0.0


class Reclaimer:
    def __init__(
        self,
        client: RuntimeClient,
        kubelet: PodResourcesClient,
        ours: Callable[[str], bool],
        shared_resources: frozenset[str],
        *,
        pods: PodStates | None = None,
        capabilities: Callable[[], frozenset[str]] = frozenset,
        interval_s: float = 30.0,
        grace_s: float = 10.0,
        metrics: PluginMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        claimed: Claimed | None = None,
        on_listed: Listed | None = None,
        listed_pods_hold: bool = False,
    ) -> None:
        self.client = client
        self.kubelet = kubelet
        self.ours = ours
        self.shared_resources = shared_resources
        self.pods = pods
        self.capabilities = capabilities
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.metrics = metrics
        self.clock = clock
        self.claimed = claimed
        self.on_listed = on_listed
        self.listed_pods_hold = listed_pods_hold
        """Mode dra: see :func:`reconcile.decide`."""
        self.memory = Memory()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._told_no_reown = False
        self.passes = 0

    def wake(self) -> None:
        """Run a pass now (a Runtime or kubelet came back)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)

    async def prompt(self) -> PassResult:
        """A pass at Allocate, when the Runtime refused for lack of room. The kubelet admits one
        container at a time and records its devices as soon as its Allocate returns, so while
        it waits on an Allocate every earlier allocation is in its pod-resources view: one pass
        is enough, and no grace period applies."""
        return await self.reconcile(prompt=True)

    async def reconcile(self, *, prompt: bool = False) -> PassResult:
        """One pass; never raises for a peer that does not answer (it skips instead)."""
        async with self._lock:
            start = time.perf_counter()
            try:
                result = await self._pass(prompt)
            except TemporaryError as e:
                log.info("reconcile_skipped", reason=str(e), released="nothing")
                result = PassResult(skipped=str(e))
            seconds = time.perf_counter() - start
            self.passes += 1
            if self.metrics is not None:
                self.metrics.reconciled(not result.skipped, seconds)
            return PassResult(
                result.released, result.reowned, result.waiting, result.skipped, seconds
            )

    async def _split(self) -> Split:
        """The Runtime's allocations of our resources, the claims' set apart. The list is taken
        while no prepare runs: a claim's allocation never shows up before its checkpoint entry."""
        if self.claimed is None:
            return Split(tuple(a for a in await allocations(self.client) if self.ours(a.resource)))
        async with self.claimed() as claimed:
            listed = await allocations(self.client)
        return split((a for a in listed if self.ours(a.resource)), claimed)

    async def _pass(self, prompt: bool) -> PassResult:
        listed = await self._split()
        if self.on_listed is not None:
            # before the kubelet is asked: what the other mode holds needs only the Runtime
            await self.on_listed(listed)
        allocs = list(listed.device_plugin)
        holdings = await self.kubelet.list()
        pods = await self.pods() if self.pods is not None else None
        now = self.clock()
        memory = self.memory
        if prompt:
            memory = Memory(
                {a.id: now - self.grace_s for a in allocs}, frozenset(a.id for a in allocs)
            )
        d = decide(
            allocs,
            holdings,
            pods,
            now=now,
            grace_s=self.grace_s,
            memory=memory,
            shared_resources=self.shared_resources,
            listed_pods_hold=self.listed_pods_hold,
        )
        if not prompt:
            self.memory = d.memory
        released = await self._release(d)
        if released and self.on_listed is not None:
            left = tuple(a for a in allocs if a.id not in released)
            await self.on_listed(replace(listed, device_plugin=left))
        reowned = await self._reown(d)
        if self.metrics is not None:
            self.metrics.unheld.set(len(d.waiting))
        return PassResult(released, reowned, tuple(v.allocation.id for v in d.waiting))

    async def _release(self, d: Decision) -> tuple[str, ...]:
        out = []
        for v in d.release:
            a = v.allocation
            await release(self.client, a.id)
            out.append(a.id)
            self._log_release(a, v.reason, "reconcile")
        for v in d.waiting:
            log.debug("allocation_unheld_waiting", allocation=v.allocation.id, reason=v.reason)
        return tuple(out)

    def _log_release(self, a: Allocation, reason: str, by: str) -> None:
        log.info(
            "allocation_released",
            allocation=a.id,
            pod=f"{a.pod[0]}/{a.pod[1]}",
            pod_uid=a.pod[2],
            container=a.container,
            resource=a.resource,
            devices=list(a.device_ids),
            reason=reason,
            by=by,
        )
        if self.metrics is not None:
            self.metrics.released.labels(a.resource, by).inc()

    async def release_stale(self, stale: list[Allocation], resource: str) -> None:
        """Free allocations of containers that are gone, found at Allocate (never a prepared
        claim's: the kubelet does not know those devices, so their handing out says nothing)."""
        if self.claimed is not None:
            async with self.claimed() as claimed:
                stale = [a for a in stale if a.id not in claimed]
        for a in stale:
            await release(self.client, a.id)
            self._log_release(
                a, f"the kubelet hands out {list(a.device_ids)} of {resource} again", "allocate"
            )

    async def _reown(self, d: Decision) -> tuple[str, ...]:
        if not d.reown:
            return ()
        caps = self.capabilities()
        if caps and UPDATE_OWNER not in caps:
            self._no_reown(f"GetVersion does not list {UPDATE_OWNER}")
            return ()
        out: list[str] = []
        for a, pod, container in d.reown:
            try:
                await update_owner(self.client, a.id, pod, container)
            except MethodMissing as e:
                self._no_reown(str(e))
                return tuple(out)
            except AllocationRefused as e:
                log.warning("allocation_reown_refused", allocation=a.id, error=str(e))
                continue
            out.append(a.id)
            log.info(
                "allocation_reowned",
                allocation=a.id,
                pod=f"{pod[0]}/{pod[1]}",
                pod_uid=pod[2],
                container=container,
                devices=list(a.device_ids),
            )
        return tuple(out)

    def _no_reown(self, why: str) -> None:
        if not self._told_no_reown:
            self._told_no_reown = True
            log.warning(
                "runtime_lacks_update_owner",
                error=why,
                effect="whole-device allocations keep their provisional owner "
                "(lj-runtimekit-unattributed); releases still work",
                fix="upgrade the Runtime",
            )
