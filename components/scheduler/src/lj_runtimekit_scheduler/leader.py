"""Leader election through a coordination.k8s.io Lease, as client-go's leaderelection does:
take the Lease when it is free or expired, renew it, and stop scheduling the moment it is lost
(optimistic concurrency on resourceVersion means two replicas never both hold it)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import structlog

from .errors import PermanentError, TemporaryError
from .kube import Json, Kube
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_scheduler.leader")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def expired(lease: Json, now: datetime) -> bool:
    spec = lease.get("spec") or {}
    renew = spec.get("renewTime") or spec.get("acquireTime")
    if not renew or not spec.get("holderIdentity"):
        return True
    return _parse(renew) + timedelta(seconds=int(spec.get("leaseDurationSeconds", 15))) < now


class Elector:
    def __init__(self, kube: Kube, settings: Settings, identity: str) -> None:
        self.kube, self.settings, self.identity = kube, settings, identity
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()

    async def _try(self) -> bool:
        s = self.settings
        lease = await self.kube.get_lease(s.namespace, s.lease_name)
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(s.lease_duration_s),
            "renewTime": _now(),
        }
        if lease is None:
            spec["acquireTime"] = spec["renewTime"]
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.lease_name, "namespace": s.namespace},
                "spec": spec,
            }
            await self.kube.put_lease(s.namespace, body, create=True)
            return True
        held = (lease.get("spec") or {}).get("holderIdentity")
        if held != self.identity and not expired(lease, datetime.now(UTC)):
            return False
        if held != self.identity:
            spec["acquireTime"] = spec["renewTime"]
            spec["leaseTransitions"] = int(lease["spec"].get("leaseTransitions", 0)) + 1
        lease["spec"] = {**lease.get("spec", {}), **spec}
        await self.kube.put_lease(s.namespace, lease, create=False)
        return True

    async def run(self) -> None:
        period = max(0.5, self.settings.lease_duration_s / 5)
        last_renew = 0.0
        renew_deadline = self.settings.lease_duration_s * 2 / 3
        loop = asyncio.get_running_loop()
        while True:
            try:
                ok = await self._try()
            except (TemporaryError, PermanentError) as e:
                # 409: another replica renewed first; anything else: try again next period
                log.info("lease_attempt_failed", error=str(e)[:200])
                ok = False
            now = loop.time()
            if ok:
                last_renew = now
                if not self.leading.is_set():
                    log.info("leader_elected", identity=self.identity)
                    self.leading.set()
            elif self.leading.is_set() and now - last_renew > renew_deadline:
                log.error("leader_lost", identity=self.identity)
                self.lost.set()
                return
            await asyncio.sleep(period)
