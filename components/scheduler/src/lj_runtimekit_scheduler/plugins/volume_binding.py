"""VolumeBinding: a pod's PersistentVolumeClaims, as kube-scheduler binds them.

PreFilter sorts the claims (:func:`..volume_binder.pod_claims`): a missing, lost or deleting
claim, or an unbound claim of an Immediate class, keeps the pod out ("pod has unbound immediate
PersistentVolumeClaims": the PV controller binds those, not the scheduler); bound local PVs
narrow the nodes to theirs. Filter checks each node (:func:`..volume_binder.find`): a bound
claim's PV must be reachable from it; a WaitForFirstConsumer claim needs a matching static PV
reachable from it or a class that may provision there (allowedTopologies, CSIStorageCapacity).
Reserve assumes the chosen PVs and claims in the storage cache, so that no other pod in flight
gets them; Unreserve gives them back. PreBind writes what the PV controller needs — the PV's
claimRef, or the claim's ``volume.kubernetes.io/selected-node`` — and waits until it has bound
every claim, or fails after the bind timeout (kube-scheduler's bindTimeoutSeconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .. import volume_binder, volumes
from ..framework import OK, SKIP, Binder, CycleState, Slot, Status, fail
from ..model import Pod
from ..state import ClusterState, NodeInfo
from ..storage import KINDS, OutOfSync, Storage
from ..volume_binder import BindingFailed, PodClaims, PodVolumes, Refused

NAME = "VolumeBinding"
NOT_LISTED = (
    "the scheduler has not listed the cluster's storage objects yet (PersistentVolumeClaims, "
    "PersistentVolumes, StorageClasses, CSI nodes, drivers and capacities): see its /healthz; "
    "its ServiceAccount needs list and watch on them"
)
POLL_S = 1.0
"""Seconds between looks at the claims while no watch event arrives (upstream polls each 1 s)."""


@dataclass(frozen=True)
class Args:
    bind_timeout: float = 600.0
    """Seconds PreBind waits for the PV controller (kube-scheduler's bindTimeoutSeconds)."""


@runtime_checkable
class VolumeWriter(Protocol):
    """The writes of PreBind (``kube.py``): a whole PV or claim, back as the apiserver has it."""

    async def update_volume(self, raw: dict[str, Any]) -> dict[str, Any]: ...

    async def update_claim(self, raw: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class _Cycle:
    claims: PodClaims
    by_node: dict[str, PodVolumes] = field(default_factory=dict)
    assumed: PodVolumes | None = None
    all_bound: bool = False


_CYCLE: Slot[_Cycle] = Slot("VolumeBinding/claims")


def ready(storage: Storage) -> bool:
    """Every storage kind has been listed at least once."""
    return all(k in storage.listed for k in KINDS)


class VolumeBinding:
    NAME = NAME

    def __init__(
        self,
        state: ClusterState,
        bind_timeout: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.storage: Storage = state.storage
        self.bind_timeout = bind_timeout
        self.clock = clock

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        if not pod.claims:
            return SKIP
        if not ready(self.storage):
            return fail(NOT_LISTED)
        try:
            claims = volume_binder.pod_claims(pod, self.storage)
        except Refused as e:
            return fail(str(e), unresolvable=True)
        if claims.immediate:
            # the PV controller binds these; a claim event requeues the pod
            return fail(volume_binder.UNBOUND_IMMEDIATE, unresolvable=True)
        cs.write(_CYCLE, _Cycle(claims))
        return Status(nodes=volume_binder.eligible_nodes(claims, self.storage))

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        cycle = cs.read(_CYCLE)
        if cycle is None:
            return OK
        node = info.node.name
        try:
            found, reasons = volume_binder.find(
                cycle.claims, node, info.node.label_map(), self.storage
            )
        except BindingFailed as e:
            return fail(str(e))
        if reasons:
            return fail(", ".join(reasons), unresolvable=True)
        cycle.by_node[node] = found
        return OK

    def reserve(self, cs: CycleState, pod: Pod, node: str) -> Status:
        """AssumePodVolumes: the chosen PVs bound and claims given the node, in the cache."""
        cycle = cs.read(_CYCLE)
        found = cycle.by_node.get(node) if cycle is not None else None
        if cycle is None or found is None or volume_binder.all_bound(pod, self.storage):
            if cycle is not None:
                cycle.all_bound = True
            return OK
        bindings: list[volume_binder.Binding] = []
        provisions: list[volumes.Claim] = []
        try:
            for b in found.bindings:
                new = volume_binder.bind_to_claim(b.volume, b.claim)
                if new is not None:
                    self.storage.assume_volume(new)
                bindings.append(volume_binder.Binding(b.claim, new or b.volume))
            for c in found.provisions:
                selected = volume_binder.select_node(c, node)
                self.storage.assume_claim(selected)
                provisions.append(selected)
        except OutOfSync as e:
            self._restore(PodVolumes(tuple(bindings), tuple(provisions)))
            return fail(str(e))
        cycle.assumed = PodVolumes(tuple(bindings), tuple(provisions))
        return OK

    def unreserve(self, cs: CycleState, pod: Pod, node: str) -> None:
        cycle = cs.read(_CYCLE)
        if cycle is not None and cycle.assumed is not None:
            self._restore(cycle.assumed)
            cycle.assumed = None

    def _restore(self, assumed: PodVolumes) -> None:
        for b in assumed.bindings:
            self.storage.restore_volume(b.volume.name)
        for c in assumed.provisions:
            self.storage.restore_claim(c.key)

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        """BindPodVolumes: write the PVs' claimRefs and the claims' selected node, then wait
        until the PV controller has bound every claim (or fail: the pod is tried again)."""
        cycle = cs.read(_CYCLE)
        if cycle is None or cycle.all_bound or cycle.assumed is None:
            return OK
        if not isinstance(binder, VolumeWriter):
            return fail("this scheduler's apiserver client cannot write PersistentVolumes")
        assumed = cycle.assumed
        bindings = []
        for b in assumed.bindings:
            back = volumes.volume(await binder.update_volume(b.volume.raw))
            bindings.append(volume_binder.Binding(b.claim, back))
        provisions = [volumes.claim(await binder.update_claim(c.raw)) for c in assumed.provisions]
        written = PodVolumes(tuple(bindings), tuple(provisions))
        try:
            await self.wait(pod, node, written)
        except BindingFailed as e:
            return fail(f"binding volumes: {e}")
        return OK

    async def wait(self, pod: Pod, node: str, written: PodVolumes) -> None:
        """Until :func:`..volume_binder.check` holds (woken by every storage event, and each
        :data:`POLL_S` for the pod's own deletion); raises :class:`BindingFailed`."""
        moved = asyncio.Event()
        self.storage.subscribe(moved.set)
        deadline = self.clock() + self.bind_timeout
        try:
            while True:
                if pod.uid not in self.state.pods:
                    raise BindingFailed("pod does not exist any more")
                info = self.state.nodes.get(node)
                labels = info.node.label_map() if info is not None else None
                if volume_binder.check(written, node, labels, self.storage):
                    return
                left = deadline - self.clock()
                if left <= 0:
                    keys = [b.claim.key for b in written.bindings]
                    waiting = ", ".join(keys + [c.key for c in written.provisions])
                    raise BindingFailed(
                        f"the PV controller did not bind {waiting} within {self.bind_timeout:g} s"
                    )
                if self.storage.stopping:
                    raise BindingFailed("the scheduler is stopping")
                moved.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(moved.wait(), min(POLL_S, left))
        finally:
            self.storage.unsubscribe(moved.set)


def new(args: Args, state: ClusterState) -> VolumeBinding:
    return VolumeBinding(state, args.bind_timeout)
