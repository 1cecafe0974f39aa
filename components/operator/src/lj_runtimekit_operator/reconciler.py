"""The reconcile loop: the policy in force → the suite's objects and the policy's status.

Level-based and restartable: everything it must remember between passes (the last ready image
of each component, a failed image, when a rollout started) is in the policy's status, so a new
leader goes on where the last one stopped. Decisions are pure (:mod:`.rollout`, :mod:`.status`,
:mod:`.render`); this module reads the cluster, calls them, and writes what they decided. It
writes only the kinds of :mod:`.objects` and the policy; a deleted policy is undone by
:mod:`.deletion`, which also takes the suite's labels and annotations off the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from . import bundled, render, rollout, status
from .deletion import Deletion
from .errors import OperatorError, PolicyError
from .informer import Informer
from .kube import Gone, Kube, pod_troubles, workload_view
from .metrics import Metrics
from .objects import RESOURCES, Obj, key
from .policy import (
    COMMON,
    COMPONENTS,
    FINALIZER,
    Component,
    Policy,
    in_force,
    parse,
)
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_operator")
Key = tuple[str, str, str]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def duplicate_message(in_force_name: str) -> str:
    return f"only one RuntimeKitPolicy per cluster; {in_force_name} is in force"


class Reconciler:
    """One leader's loop. ``changed`` is set by the policy watch; ``failing`` says what does not
    work now (shown on /healthz)."""

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.kube, self.metrics, self.clock = settings, kube, metrics, clock
        self.changed = asyncio.Event()
        self.policies: Informer[Obj] = Informer(
            "policies",
            self._list_policies,
            self.kube.watch_policies,
            lambda kind, obj: self.changed.set(),
            on_relist=lambda items: self.changed.set(),
            gone=(Gone,),
            retry=(OperatorError,),
            log=log,
        )
        self.deletion = Deletion(settings, kube, metrics, clock)
        self._failing: dict[str, str] = {}
        self._applied: dict[str, str] = {}  # component → digest of what was applied last
        self._pruned: set[str] = set()  # disabled components whose objects are gone
        self._policy_uid = ""
        self._last_resync = 0.0

    # ------------------------------------------------------------------ loops

    @property
    def failing(self) -> dict[str, str]:
        """What does not work now (the policy watch, the last pass); /healthz shows it."""
        watch = {"watch": self.policies.failing} if self.policies.failing is not None else {}
        return watch | self._failing

    async def watch(self) -> None:
        """Sets ``changed`` on every change of a policy; lists again after a 410."""
        await self.policies.run()

    async def _list_policies(self) -> tuple[Sequence[Obj], str]:
        listing = await self.kube.list_policies()
        items = listing.get("items")
        return (items if isinstance(items, list) else []), str(
            _meta(listing).get("resourceVersion", "")
        )

    async def run(self) -> None:
        """Reconcile on every change, every ``progress_interval`` while something is moving,
        and every ``resync_period`` regardless."""
        while True:
            self.changed.clear()
            busy = True
            try:
                busy = await self.reconcile()
                self.metrics.reconciles.inc()
                self._failing.pop("reconcile", None)
            except OperatorError as e:
                self.metrics.reconcile_errors.labels(type(e).__name__).inc()
                self._failing["reconcile"] = str(e)[:300]
                log.warning("reconcile_failed", error=str(e)[:300])
            wait = self.settings.progress_interval if busy else self.settings.resync_period
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), wait)

    # ------------------------------------------------------------------ one pass

    async def reconcile(self) -> bool:
        """One pass over every policy; True while something is still moving."""
        now = self.clock()
        if now - self._last_resync >= self.settings.resync_period:
            self._applied.clear()  # apply everything again: undo drift, remove strays
            self._pruned.clear()
            self._last_resync = now
        items: list[Obj] = (await self.kube.list_policies()).get("items") or []
        # A policy that is going away without our finalizer was never in force: ignore it.
        candidates = [
            p
            for p in items
            if not _meta(p).get("deletionTimestamp")
            or FINALIZER in (_meta(p).get("finalizers") or [])
        ]
        chosen = in_force(candidates)
        if chosen is None:
            return False
        name = str(_meta(chosen).get("name"))
        for other in candidates:
            if other is not chosen and not _meta(other).get("deletionTimestamp"):
                await self._refuse(other, "DuplicatePolicy", duplicate_message(name))
        if str(_meta(chosen).get("uid")) != self._policy_uid:
            self._policy_uid = str(_meta(chosen).get("uid"))
            self._applied.clear()
            self._pruned.clear()
        if _meta(chosen).get("deletionTimestamp"):
            return await self._tear_down(chosen)
        chosen = await self._ensure_finalizer(chosen)
        bundle = bundled.load()
        try:
            policy = parse(chosen, bundle.registry, bundle.version)
        except PolicyError as e:
            await self._refuse(chosen, "InvalidSpec", str(e))
            return False
        return await self._converge(chosen, policy, bundle, now)

    async def _refuse(self, obj: Obj, reason: str, message: str) -> None:
        old = obj.get("status") or {}
        now = status.timestamp(self.clock())
        new = {
            **old,
            "observedGeneration": _meta(obj).get("generation", 0),
            "conditions": status.refused(reason, message, old.get("conditions") or [], now),
        }
        if new != old:
            await self.kube.patch_status(str(_meta(obj)["name"]), new)

    async def _ensure_finalizer(self, obj: Obj) -> Obj:
        finalizers = list(_meta(obj).get("finalizers") or [])
        if FINALIZER in finalizers:
            return obj
        return await self.kube.set_finalizers(
            str(_meta(obj)["name"]),
            [*finalizers, FINALIZER],
            str(_meta(obj).get("resourceVersion", "")),
        )

    async def _tear_down(self, obj: Obj) -> bool:
        """Undo the deleted policy (:mod:`.deletion`), then let it go. True while it goes on."""
        busy = await self.deletion.step(obj)
        if not busy:
            self._applied.clear()
            self._pruned.clear()
        return busy

    async def _prune(self, policy: str, component: str, keep: set[Key]) -> int:
        """Delete the component's objects that the policy no longer names; how many."""
        gone = 0
        for res in reversed(RESOURCES):
            for item in await self.kube.list_objects(res.kind, render.selector(policy, component)):
                if key(item) in keep or _meta(item).get("deletionTimestamp"):
                    continue
                meta = _meta(item)
                await self.kube.delete(res.kind, str(meta.get("namespace") or ""), meta["name"])
                self.metrics.deletes.labels(component).inc()
                log.info("object_removed", component=component, object="/".join(key(item)))
                gone += 1
        return gone

    async def _apply(self, policy: Policy, component: str, objs: list[Obj]) -> None:
        """Apply ``objs`` and prune the rest of the component, when they changed since the last
        apply (or a resync is due)."""
        digest = render.digest(objs)
        if self._applied.get(component) == digest:
            return
        for obj in objs:
            await self.kube.apply(obj)
            self.metrics.applies.labels(component).inc()
        await self._prune(policy.name, component, {key(o) for o in objs})
        self._applied[component] = digest
        self._pruned.discard(component)
        log.info("component_applied", component=component, objects=len(objs), digest=digest)

    async def _remove(self, policy: Policy, component: str) -> None:
        if component in self._pruned:
            return
        await self._prune(policy.name, component, set())
        self._applied.pop(component, None)
        self._pruned.add(component)

    async def _converge(self, obj: Obj, policy: Policy, bundle: bundled.Bundle, now: float) -> bool:
        old = obj.get("status") or {}
        prior = status.records(old)
        enabled = [c for c in policy.components if c.enabled]
        error = ""
        try:
            if enabled:
                common = render.render(policy, COMMON, bundle.objects[COMMON])
                await self._apply(policy, COMMON, common)
            else:
                await self._remove(policy, COMMON)
        except OperatorError as e:
            error = f"{COMMON}: {e}"
        records: list[rollout.Record] = []
        may_start, blocker = not error, COMMON if error else ""
        for c in COMPONENTS:
            spec = policy.component(c.name)
            before = prior.get(c.name, rollout.Record(c.name))
            try:
                if not spec.enabled:
                    await self._remove(policy, c.name)
                    decision = rollout.disabled(before)
                else:
                    decision = await self._step(
                        policy,
                        c,
                        before=before,
                        bundle=bundle,
                        now=now,
                        may_start=may_start,
                        blocker=blocker,
                    )
            except OperatorError as e:
                error = error or f"{c.name}: {e}"
                log.warning("component_apply_failed", component=c.name, error=str(e)[:300])
                decision = rollout.Decision(
                    None,
                    dataclasses.replace(before, message=f"apply failed: {e}"[:1024]),
                    settled=False,
                )
            if decision.record.failed_image and decision.record.failed_image != before.failed_image:
                self.metrics.rollbacks.labels(c.name).inc()
                log.error("rollout_failed", component=c.name, message=decision.record.message)
            if not decision.settled and may_start:
                may_start, blocker = False, c.name
            if spec.enabled:
                self.metrics.component_ready.labels(c.name).set(1 if decision.record.ready else 0)
            records.append(decision.record)
        stamp = status.timestamp(now)
        conds = status.conditions(
            [r for r in records if r.enabled], old.get("conditions") or [], stamp
        )
        if error:
            conds = status.with_error(
                conds, "ApplyFailed", error, old.get("conditions") or [], stamp
            )
        new = {
            "observedGeneration": policy.generation,
            "namespace": policy.namespace,
            "components": [status.record_to_json(r) for r in records],
            "conditions": conds,
        }
        if new != old:
            await self.kube.patch_status(policy.name, new)
        return bool(error) or any(r.enabled and not r.ready for r in records)

    async def _step(
        self,
        policy: Policy,
        c: Component,
        *,
        before: rollout.Record,
        bundle: bundled.Bundle,
        now: float,
        may_start: bool,
        blocker: str,
    ) -> rollout.Decision:
        spec = policy.component(c.name)
        views = []
        for workload in c.workloads:
            found = await self.kube.get(c.kind, policy.namespace, workload)
            views.append(workload_view(found) if found is not None else None)
        seen = rollout.combine(views)
        troubles: list[rollout.PodTrouble] = []
        if seen is not None and not (seen.image == spec.image and seen.ready):
            apps = f"app in ({','.join(c.workloads)})"
            troubles = pod_troubles(await self.kube.list_pods(policy.namespace, apps))
        decision = rollout.decide(
            spec,
            before,
            seen,
            troubles,
            now=now,
            deadline=self.settings.rollout_deadline,
            may_start=may_start,
            blocker=blocker,
        )
        if decision.image is not None:
            objs = render.render(policy, spec.name, bundle.objects[spec.name], decision.image)
            await self._apply(policy, spec.name, objs)
        return decision
