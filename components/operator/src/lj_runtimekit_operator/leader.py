"""Leader election through a coordination.k8s.io Lease, with client-go's semantics.

Shape file (docs/shape.md): every leader-elected component (scheduler, controller) carries this
file as ``leader.py``, byte for byte; ``tests/shape_tests/test_drift.py`` fails when a copy
differs from ``tests/shape_tests/canonical/leader.py``. The component's ``kube.py`` provides the
:class:`LeaseApi`.

Safe under clock skew, as client-go's ``leaderelection`` is: a replica never compares the
``renewTime`` another replica wrote with its own clock. It remembers when *it* saw the Lease
record change (``observed_at``, its own monotonic clock) and takes the Lease over only when the
record has not changed for the record's ``leaseDurationSeconds`` since. The leader gives up
leading when it could not renew for ``renew_deadline`` (shorter than the lease duration), so it
has stopped before any follower's wait is over. Times written into the Lease are for people and
other tools only.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

log = structlog.get_logger("leader")
Json = dict[str, Any]


class LeaseError(Exception):
    """The apiserver did not read or write the Lease (the adapter converts its errors to this)."""


class LeaseConflict(LeaseError):
    """Another replica wrote the Lease first (409 on create or on replace at resourceVersion)."""


class LeaseApi(Protocol):
    """One Lease object of the apiserver, as JSON (``metadata.resourceVersion`` included)."""

    async def get(self) -> Json | None: ...
    async def create(self, lease: Json) -> Json: ...
    async def replace(self, lease: Json) -> Json: ...


def _wall() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Json | None) -> Json:
    spec = (lease or {}).get("spec")
    return dict(spec) if isinstance(spec, dict) else {}


class Elector:
    """Takes and holds the Lease for ``identity``; ``leading`` is set while it holds it."""

    def __init__(
        self,
        api: LeaseApi,
        identity: str,
        *,
        namespace: str,
        name: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = _wall,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(
                "leader election needs retry_period < renew_deadline < lease_duration, got "
                f"{retry_period}, {renew_deadline}, {lease_duration}"
            )
        self.api, self.identity, self.namespace, self.name = api, identity, namespace, name
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self.observed: Json = {}
        """The Lease record as last seen (spec), and when, by our own clock: ``observed_at``."""
        self.observed_at = 0.0

    def _observe(self, record: Json) -> None:
        if record != self.observed:
            self.observed, self.observed_at = record, self.clock()

    def _expired(self) -> bool:
        raw = self.observed.get("leaseDurationSeconds")
        duration = float(raw) if isinstance(raw, int | float) and raw > 0 else self.lease_duration
        return self.clock() >= self.observed_at + duration

    async def try_acquire_or_renew(self) -> bool:
        """One try: True when we hold the Lease afterwards (client-go's tryAcquireOrRenew)."""
        lease = await self.api.get()
        now = self.wall()
        mine = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": mine,
            }
            try:
                await self.api.create(body)
            except LeaseConflict:
                return False
            self._observe(dict(mine))
            return True
        record = _record(lease)
        self._observe(record)
        holder = record.get("holderIdentity") or ""
        if holder and holder != self.identity and not self._expired():
            return False
        transitions = record.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        if holder == self.identity:
            mine["acquireTime"] = record.get("acquireTime") or now
            mine["leaseTransitions"] = transitions
        else:
            mine["leaseTransitions"] = transitions + 1
        updated = copy.deepcopy(lease)
        updated["spec"] = {**record, **mine}
        try:
            await self.api.replace(updated)
        except LeaseConflict:
            return False
        self._observe(dict(updated["spec"]))
        return True

    async def _try(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except LeaseError as e:
            log.info("lease_try_failed", lease=f"{self.namespace}/{self.name}", error=str(e)[:300])
            return False

    async def run(self) -> None:
        """Take the Lease (trying every retry period), then renew it every retry period until a
        renewal has not succeeded for ``renew_deadline``: then ``lost`` is set and it returns."""
        while not await self._try():
            await self.sleep(self.retry_period)
        log.info("leader_elected", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        self.leading.set()
        renewed = self.clock()
        while True:
            await self.sleep(self.retry_period)
            if await self._try():
                renewed = self.clock()
            elif self.clock() - renewed >= self.renew_deadline:
                log.error(
                    "leader_lost",
                    lease=f"{self.namespace}/{self.name}",
                    identity=self.identity,
                    effect="stopping work; the daemon exits so that it restarts as a follower",
                )
                self.leading.clear()
                self.lost.set()
                return

    async def release(self) -> None:
        """Give the Lease up at shutdown so another replica takes over at once."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = await self.api.get()
            record = _record(lease)
            if lease is None or record.get("holderIdentity") != self.identity:
                return
            updated = copy.deepcopy(lease)
            updated["spec"] = {
                **record,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": self.wall(),
            }
            await self.api.replace(updated)
        except LeaseError as e:
            log.warning("lease_release_failed", error=str(e)[:300])
