"""Leader election through a coordination.k8s.io Lease, as client-go's leaderelection does."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import structlog

from .errors import TemporaryError
from .kube import Conflict, Kube, Obj

log = structlog.get_logger("lj_runtimekit_controller.leader")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(ts: str | None) -> float:
    if not ts:
        return 0.0
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class LeaderElector:
    """Holds the Lease ``name`` for ``identity``; ``is_leader`` is set while it is held."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float = 15.0,
        renew_s: float = 10.0,
        retry_s: float = 2.0,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_s, self.renew_s, self.retry_s = lease_s, renew_s, retry_s
        self.is_leader = asyncio.Event()
        self.lost = asyncio.Event()

    async def _try(self) -> bool:
        lease = await self.kube.get_lease(self.namespace, self.name)
        now = _now()
        if lease is None:
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {},
            }
        spec = lease.setdefault("spec", {})
        holder = spec.get("holderIdentity")
        expires = _epoch(spec.get("renewTime")) + float(spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and time.time() < expires:
            return False
        if holder != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=int(self.lease_s), renewTime=now
        )
        try:
            await self.kube.put_lease(self.namespace, lease)
        except Conflict:
            return False
        return True

    async def run(self) -> None:
        """Acquire, then renew until a renewal misses ``renew_s``; then set ``lost`` and return."""
        while not self.is_leader.is_set():
            try:
                if await self._try():
                    self.is_leader.set()
                    log.info("leader_acquired", lease=self.name, identity=self.identity)
                    break
            except TemporaryError as e:
                log.warning("leader_election_error", error=str(e))
            await asyncio.sleep(self.retry_s)
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_s)
            try:
                if await self._try():
                    last = time.monotonic()
                    continue
                log.error("leader_lost", lease=self.name, reason="held by another")
            except TemporaryError as e:
                if time.monotonic() - last < self.renew_s:
                    log.warning("lease_renew_failed", error=str(e))
                    continue
                log.error("leader_lost", lease=self.name, reason=str(e))
            self.is_leader.clear()
            self.lost.set()
            return

    async def release(self) -> None:
        """Give the Lease up at shutdown so another replica takes over at once."""
        if not self.is_leader.is_set():
            return
        lease: Obj | None = await self.kube.get_lease(self.namespace, self.name)
        if lease and lease.get("spec", {}).get("holderIdentity") == self.identity:
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            try:
                await self.kube.put_lease(self.namespace, lease)
            except (Conflict, TemporaryError) as e:
                log.warning("lease_release_failed", error=str(e))
