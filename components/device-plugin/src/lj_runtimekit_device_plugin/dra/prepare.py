"""Preparing and unpreparing DRA claims on this node (mode dra): Runtime ``Allocate`` for exactly
the claim's devices, a CDI spec the container runtime applies, a checkpoint; ``Release`` when the
kubelet unprepares.

What the Runtime is asked for a claim's results (whole devices, shares, partitions) is decided
by :mod:`.plan`; this module does the asking, the files and the checkpoint.

A result that is a partition made on demand (``dra_partitions: dynamic``, see
:func:`.offers.offers`) gets its MIG instance or TDM slice made first (``CreatePartition``):
an idle partition of the same profile on that GPU is taken over instead, and when the new one does
not fit beside the GPU's idle partitions (left by a layout, or by an unprepare that could not
remove them) those are removed first. The scheduler's counters guarantee it fits beside the ones
claims hold. Unprepare removes the claim's partitions after releasing, so a GPU whose claims all
ended is whole again. A whole-GPU result on such a GPU removes its idle partitions first.

Order of a prepare, so that a crash at any step leaves nothing the next call cannot finish or undo:
Runtime allocation(s) → CDI spec file (atomic) → checkpoint (atomic) → answer. A failure before
the checkpoint releases what this call allocated and removes its spec. A repeated prepare of a
claim in the checkpoint allocates nothing: it answers the same CDI ids (which are a function of
claim uid, request, device and share id, see :func:`.plan.cdi_key`). An unprepare of a claim the
checkpoint does not know succeeds (it was never prepared here, or already unprepared).

Every prepare refused or failed shows on the pods the claim is reserved for (:mod:`.refusals`).

All prepares and unprepares of the node run one at a time, under the lock of
:class:`.plugin.DRAPlugin` (the only caller): the checkpoint is one file, and the kubelet calls
for a pod's claims together.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from ..errors import DevicePluginError, PermanentError, TemporaryError
from ..files import write_atomic
from ..model import Allocation, Device, Injection
from ..pod_events import PodEvents
from ..resources import ResourceNames
from ..runtime import RuntimeClient, allocations, release
from .cdi import PreparedDevice, cdi_device_id, claim_spec, device_name, spec_file_name
from .checkpoint import Checkpoint, CheckpointStore, ClaimRecord
from .claims import (
    ClaimAllocation,
    ClaimNotPreparable,
    claim_allocation,
    container_of,
    ours,
)
from .offers import STATIC, Offer, offers
from .plan import (
    ClaimRef,
    Outcome,
    PreparedClaimDevice,
    RuntimeAsk,
    Target,
    allocation_plan,
    cdi_key,
)
from .refusals import tell
from .runtime_partitions import PartitionClient, PartitionRefused

log = structlog.get_logger(__name__)

ReadObject = Callable[[str, str], Awaitable[dict[str, Any]]]
"""(namespace, name) → the object as API JSON."""


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


class Preparer:
    """The node side of DRA for one driver and one pool (the node). One call at a time: the
    caller (:class:`.plugin.DRAPlugin`) holds the lock."""

    def __init__(
        self,
        runtime: RuntimeClient,
        *,
        read_claim: ReadObject,
        read_pod: ReadObject,
        devices: Callable[[], Sequence[Device]],
        store: CheckpointStore,
        names: ResourceNames,
        driver: str,
        pool: str,
        cdi_dir: Path,
        cdi_kind: str,
        partitions: PartitionClient | None = None,
        policy: str = STATIC,
        events: PodEvents | None = None,
    ) -> None:
        self.events = events or PodEvents(None)
        """Warning Events on the pods of a claim whose prepare is refused or fails."""
        self.runtime = runtime
        self.partitions = partitions
        """Makes and removes partitions on demand (policy dynamic)."""
        self.policy = policy
        self.read_claim = read_claim
        self.read_pod = read_pod
        self.devices = devices
        self.store = store
        self.names = names
        self.driver = driver
        self.pool = pool
        self.cdi_dir = cdi_dir
        self.cdi_kind = cdi_kind
        self.checkpoint, outcome = store.load()
        log.info(
            "dra_checkpoint_loaded",
            path=str(store.path),
            outcome=outcome.value,
            claims=len(self.checkpoint.claims),
        )

    async def close(self) -> None:
        """Close the ConfigService client (policy dynamic)."""
        if self.partitions is not None:
            await self.partitions.close()

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / spec_file_name(self.cdi_kind, uid)

    def _save(self, claims: Mapping[str, ClaimRecord]) -> None:
        cp = Checkpoint(self.checkpoint.boot_id, dict(claims))
        try:
            self.store.save(cp)
        except OSError as e:
            raise TemporaryError(f"writing the DRA checkpoint {self.store.path}: {e}") from e
        self.checkpoint = cp

    # ------------------------------------------------------------------------------ prepare

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """One outcome per claim uid; a failure of one claim is that claim's ``error``."""
        out = {}
        for ref in refs:
            read: list[ClaimAllocation] = []
            try:
                out[ref.uid] = Outcome(await self._prepare(ref, read))
            except DevicePluginError as e:
                out[ref.uid] = Outcome(error=str(e))
                await tell(self.events, ref, e, read[0] if read else None, self._where(ref))
        return out

    async def refuse(self, ref: ClaimRef, why: str) -> Outcome:
        """A prepare refused before it starts (:class:`.plugin.DRAPlugin` in mode
        device-plugin): logged, and shown on the claim's pods like any other refusal."""
        try:
            claim: ClaimAllocation | None = await self._claim(ref)
        except DevicePluginError as e:
            log.info("dra_claim_unread", claim=f"{ref.namespace}/{ref.name}", error=str(e))
            claim = None
        await tell(self.events, ref, ClaimNotPreparable(why), claim, self._where(ref))
        return Outcome(error=why)

    def _where(self, ref: ClaimRef) -> str:
        return f"claim {ref.namespace}/{ref.name} on node {self.pool} (driver {self.driver})"

    async def _claim(self, ref: ClaimRef) -> ClaimAllocation:
        claim = claim_allocation(await self.read_claim(ref.namespace, ref.name))
        if claim.uid != ref.uid:
            raise ClaimNotPreparable(
                f"claim {ref.namespace}/{ref.name} has uid {claim.uid}, the kubelet asked for "
                f"{ref.uid}: it was deleted and made again"
            )
        return claim

    def _answer(self, claim: ClaimAllocation) -> tuple[PreparedClaimDevice, ...]:
        """The kubelet's answer for ``claim``: its devices here, each with its CDI id."""
        return tuple(
            PreparedClaimDevice(
                requests=(r.request,),
                pool=r.pool,
                device=r.device,
                cdi_device_ids=(
                    cdi_device_id(self.cdi_kind, device_name(claim.uid, r.request, cdi_key(r))),
                ),
                share_id=r.share_id,
            )
            for r in ours(claim, self.driver, self.pool)
        )

    async def _prepare(
        self, ref: ClaimRef, read: list[ClaimAllocation]
    ) -> tuple[PreparedClaimDevice, ...]:
        """Prepare one claim; the claim, once read (and the kubelet's), is put in ``read``."""
        claim = await self._claim(ref)
        read.append(claim)
        results = ours(claim, self.driver, self.pool)
        if not results:
            raise ClaimNotPreparable(
                f"claim {ref.namespace}/{ref.name} has no device of driver {self.driver} in "
                f"pool {self.pool}"
            )
        if ref.uid in self.checkpoint.claims:
            log.info("dra_prepare_repeated", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
            return self._answer(claim)
        catalogue = {o.name: o for o in offers(self.devices(), self.policy)}
        unknown = [r.device for r in results if r.device not in catalogue]
        if unknown:
            raise ClaimNotPreparable(
                f"claim {ref.namespace}/{ref.name}: devices {unknown} are not in this node's "
                "inventory (the ResourceSlice the scheduler read is stale)"
            )
        if not claim.pods:
            raise ClaimNotPreparable(f"claim {ref.namespace}/{ref.name} is reserved for no pod")
        pod_name, pod_uid = claim.pods[0]
        try:
            container = container_of(await self.read_pod(ref.namespace, pod_name), ref.name)
        except DevicePluginError as e:
            log.info("dra_pod_unread", pod=f"{ref.namespace}/{pod_name}", error=str(e))
            container = ""
        made: list[Allocation] = []
        taken: list[str] = []
        spec_path = self.spec_path(ref.uid)
        try:
            by_name = await self._targets([catalogue[r.device] for r in results], taken)
            plan = allocation_plan(results, by_name, self.names)
            owner = (ref.namespace, pod_name, pod_uid)
            injections = await self._allocate(plan, owner, container or f"claim-{ref.name}", made)
            prepared = [
                PreparedDevice(r.request, r.pool, cdi_key(r), injections[i])
                for i, r in enumerate(results)
            ]
            spec, _ = claim_spec(ref.uid, prepared, self.cdi_kind)
            try:
                # a temporary name CDI never reads (it reads *.json and *.yaml) until the
                # rename; 0644: the container runtime reads it
                write_atomic(
                    spec_path, json.dumps(spec, indent=1).encode(), mode=0o644, sync_dir=False
                )
            except OSError as e:
                raise TemporaryError(f"writing the CDI spec {spec_path}: {e}") from e
            answer = self._answer(claim)
            record = ClaimRecord(
                namespace=ref.namespace,
                name=ref.name,
                devices=tuple(f"{r.pool}/{r.device}" for r in results),
                allocation_ids=tuple(a.id for a in made),
                cdi_device_ids=tuple(i for d in answer for i in d.cdi_device_ids),
                partition_ids=tuple(taken),
            )
            self._save({**self.checkpoint.claims, ref.uid: record})
        except BaseException:
            await self._undo(made, spec_path)
            await self._remove_partitions(taken)
            raise
        log.info(
            "dra_claim_prepared",
            claim=f"{ref.namespace}/{ref.name}",
            uid=ref.uid,
            pod=f"{ref.namespace}/{pod_name}",
            devices=[by_name[r.device].unit for r in results],
            shares=[
                (ask.device_ids[0], ask.core_percent, ask.memory_bytes)
                for ask in plan
                if ask.shared
            ],
            allocations=[a.id for a in made],
        )
        return answer

    async def _targets(self, wanted: Sequence[Offer], taken: list[str]) -> dict[str, Target]:
        """Each offer's Runtime target; partitions made on demand are made (or taken over) here
        and appended to ``taken`` as soon as they are ours (what an undo removes)."""
        out: dict[str, Target] = {}
        for o in wanted:
            if o.name in out:
                continue
            if o.kind == "partition":
                out[o.name] = Target(o.device, o.partition_id)
            elif o.kind == "whole":
                if o.counter_set:
                    await self._clear_idle(o.device.id, keep=())
                out[o.name] = Target(o.device, o.device.id)
            else:
                out[o.name] = Target(o.device, await self._make(o, taken))
        return out

    def _client(self) -> PartitionClient:
        if self.partitions is None:
            raise PermanentError(
                "this plugin makes no partitions on demand (no ConfigService client): "
                "it was started without dra_partitions: dynamic"
            )
        return self.partitions

    async def _idle(self, device_id: str) -> list[tuple[str, str]]:
        """(id, profile) of the partitions ``device_id`` has now that no allocation holds and no
        prepared claim has taken."""
        device = next((d for d in await self.runtime.list_devices() if d.id == device_id), None)
        if device is None:
            raise ClaimNotPreparable(f"the Runtime no longer lists device {device_id}")
        held = {u for a in await allocations(self.runtime) for u in a.device_ids}
        held |= {p for r in self.checkpoint.claims.values() for p in r.partition_ids}
        return [(p.id, p.profile) for p in device.partitions if p.id not in held]

    async def _clear_idle(self, device_id: str, keep: Sequence[str]) -> None:
        for part_id, _ in await self._idle(device_id):
            if part_id not in keep:
                await self._client().delete(part_id)
                log.info("dra_idle_partition_removed", device=device_id, partition=part_id)

    async def _make(self, o: Offer, taken: list[str]) -> str:
        """The partition for on-demand offer ``o``: an idle one of its profile, else a new one
        (after removing the GPU's other idle partitions when it does not fit beside them)."""
        idle = await self._idle(o.device.id)
        reuse = next((i for i, profile in idle if profile == o.profile and i not in taken), "")
        if reuse:
            taken.append(reuse)
            return reuse
        client = self._client()
        make = {"profile": o.profile} if o.kind == "mig" else {"percent": o.percent}
        try:
            part_id = await client.create(o.device.id, **make)
        except PartitionRefused as e:
            if not idle:
                raise
            log.info("dra_partition_does_not_fit", device=o.device.id, error=str(e))
            await self._clear_idle(o.device.id, keep=taken)
            part_id = await client.create(o.device.id, **make)
        taken.append(part_id)
        log.info("dra_partition_made", device=o.device.id, profile=o.profile, partition=part_id)
        return part_id

    async def _remove_partitions(self, part_ids: Sequence[str]) -> None:
        """Best effort, after a failed prepare: a partition left is idle, and the next prepare
        on its GPU takes it over or removes it."""
        for part_id in part_ids:
            try:
                await self._client().delete(part_id)
            except DevicePluginError as e:
                log.warning("dra_undo_partition_failed", partition=part_id, error=str(e))

    async def _allocate(
        self,
        plan: Sequence[RuntimeAsk],
        pod: tuple[str, str, str],
        container: str,
        made: list[Allocation],
    ) -> dict[int, Injection]:
        """The Runtime allocations of ``plan``, each appended to ``made`` as soon as it exists
        (what an undo releases); the injection of each result index."""
        injections: dict[int, Injection] = {}
        for ask in plan:
            a = await self.runtime.allocate(
                pod=pod,
                container=container,
                resource=ask.resource,
                device_ids=list(ask.device_ids),
                core_percent=ask.core_percent,
                memory_bytes=ask.memory_bytes,
            )
            made.append(a)
            injections.update((i, a.injection) for i in ask.results)
        return injections

    async def _undo(self, made: Sequence[Allocation], spec_path: Path) -> None:
        _remove(spec_path)
        for a in made:
            try:
                await release(self.runtime, a.id)
            except DevicePluginError as e:
                log.error(
                    "dra_undo_release_failed",
                    allocation=a.id,
                    error=str(e),
                    effect="an allocation no claim holds until the Runtime forgets it",
                )

    # ---------------------------------------------------------------------------- unprepare

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim uid → error ("" when it is unprepared)."""
        out = {}
        for ref in refs:
            try:
                await self._unprepare(ref)
                out[ref.uid] = ""
            except DevicePluginError as e:
                log.warning(
                    "dra_unprepare_failed",
                    claim=f"{ref.namespace}/{ref.name}",
                    uid=ref.uid,
                    error=str(e),
                )
                out[ref.uid] = str(e)
        return out

    async def _unprepare(self, ref: ClaimRef) -> None:
        record = self.checkpoint.claims.get(ref.uid)
        if record is None:
            _remove(self.spec_path(ref.uid))
            log.info("dra_unprepare_unknown_claim", claim=f"{ref.namespace}/{ref.name}")
            return
        left = list(record.allocation_ids)
        for allocation_id in record.allocation_ids:
            await release(self.runtime, allocation_id)  # unknown ids are not an error
            left.remove(allocation_id)
            if left:  # a failure after this leaves only what is still held to release
                self._save(
                    {**self.checkpoint.claims, ref.uid: replace(record, allocation_ids=tuple(left))}
                )
        parts = list(record.partition_ids)
        for part_id in record.partition_ids:
            try:
                await self._client().delete(part_id)
            except PartitionRefused as e:  # another allocation holds it: not ours to remove
                log.warning("dra_partition_kept", partition=part_id, error=str(e))
            parts.remove(part_id)
            if parts:  # a failure after this leaves only what is still to remove
                self._save(
                    {
                        **self.checkpoint.claims,
                        ref.uid: replace(record, allocation_ids=(), partition_ids=tuple(parts)),
                    }
                )
        _remove(self.spec_path(ref.uid))
        self._save({u: r for u, r in self.checkpoint.claims.items() if u != ref.uid})
        log.info(
            "dra_claim_unprepared",
            claim=f"{ref.namespace}/{ref.name}",
            uid=ref.uid,
            released=list(record.allocation_ids),
            partitions_removed=list(record.partition_ids),
        )
