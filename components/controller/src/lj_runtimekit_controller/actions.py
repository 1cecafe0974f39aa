"""The action loop: caches of nodes and agent Jobs from list+watch, workers that reconcile."""

from __future__ import annotations

import asyncio
import shlex
import time
from datetime import UTC, datetime

import structlog

from . import job_spec, names, partitioning, reconcile, status
from .errors import PermanentError, TemporaryError
from .kube import Gone, Kube, Obj, job_node, job_view
from .metrics import Metrics
from .partition_layout import Layout, LayoutError, parse_configmap
from .settings import Settings
from .workqueue import WorkQueue

log = structlog.get_logger("lj_runtimekit_controller.actions")


def _rv(obj: Obj) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ActionLoop:
    """Reconciles every node's label into agent Jobs; started once this replica leads."""

    def __init__(self, settings: Settings, kube: Kube, metrics: Metrics) -> None:
        self.s, self.kube, self.metrics = settings, kube, metrics
        self.nodes: dict[str, Obj] = {}
        self.jobs: dict[str, Obj] = {}
        self.layouts: dict[str, Layout | LayoutError] | None = None
        """The partition layouts of the ConfigMap; None while it does not exist."""
        self.queue = WorkQueue()
        self.synced = {
            "nodes": asyncio.Event(),
            "jobs": asyncio.Event(),
            "configmaps": asyncio.Event(),
        }
        self.failing: dict[str, str] = {}
        """Kind → why its list/watch fails now (shown in /healthz; the rest keeps working)."""
        self._reserved = 0
        self.policy = reconcile.Policy(
            retry_limit=settings.retry_limit,
            backoff_s=settings.retry_backoff,
            backoff_max_s=settings.retry_backoff_max,
            max_active_jobs=settings.max_active_jobs,
        )
        self.template = job_spec.JobTemplate(
            image=settings.job_image,
            namespace=settings.namespace,
            deadline_s=settings.job_deadline,
            backoff_limit=settings.job_backoff_limit,
            socket_dir=settings.socket_dir,
            containerd_dir=settings.containerd_dir,
            pod_resources_dir=settings.pod_resources_dir,
            agent_args=tuple(shlex.split(settings.job_agent_args)),
            priority_class=settings.job_priority_class,
            pod_annotations=tuple(
                (k.strip(), v.strip())
                for k, _, v in (
                    item.partition("=") for item in settings.job_pod_annotations.split(",") if item
                )
            ),
        )

    # ------------------------------------------------------------------ caches
    def _store(self, cache: dict[str, Obj], obj: Obj) -> bool:
        name = obj["metadata"]["name"]
        old = cache.get(name)
        if old is not None and _rv(old) > _rv(obj):
            return False  # an event older than what our own write returned
        cache[name] = obj
        return True

    def _enqueue(self, kind: str, obj: Obj) -> None:
        node = obj["metadata"]["name"] if kind == "nodes" else job_node(obj)
        if node:
            self.queue.add(node)

    def _set_layouts(self, configmap: Obj | None) -> None:
        """Read the layouts ConfigMap (None: absent) and queue the nodes that select a layout."""
        self.layouts = None if configmap is None else parse_configmap(configmap.get("data"))
        for name, layout in (self.layouts or {}).items():
            if isinstance(layout, LayoutError):
                log.warning("partition_layout_refused", layout=name, error=str(layout))
        for name, node in self.nodes.items():
            if self.s.layout_label_key in (node["metadata"].get("labels") or {}):
                self.queue.add(name)

    async def _sync_layouts(self) -> None:
        delay = 1.0
        while True:
            try:
                listing = await self.kube.list_configmap(self.s.namespace, self.s.layouts_configmap)
                items = listing.get("items") or []
                self._set_layouts(items[0] if items else None)
                self.synced["configmaps"].set()
                self.failing.pop("configmaps", None)
                rv = listing["metadata"]["resourceVersion"]
                while True:
                    async for kind_of_event, obj in self.kube.stream(
                        "configmaps", self.s.namespace, rv, name=self.s.layouts_configmap
                    ):
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if kind_of_event != "BOOKMARK":
                            self._set_layouts(None if kind_of_event == "DELETED" else obj)
                    delay = 1.0
            except Gone:
                log.info("watch_expired", kind="configmaps")
            except TemporaryError as e:
                log.warning("watch_failed", kind="configmaps", error=str(e), retry_in_s=delay)
                self.failing["configmaps"] = str(e)[:300]
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def sync(self, kind: str) -> None:
        """List, then watch ``kind`` forever; list again when the watch is too old or breaks."""
        if kind == "configmaps":
            await self._sync_layouts()
            return
        cache = self.nodes if kind == "nodes" else self.jobs
        delay = 1.0
        while True:
            try:
                listing = await (
                    self.kube.list_nodes(self.s.node_selector)
                    if kind == "nodes"
                    else self.kube.list_jobs(self.s.namespace)
                )
                fresh = {o["metadata"]["name"]: o for o in listing.get("items") or []}
                for gone in set(cache) - set(fresh):
                    self._enqueue(kind, cache.pop(gone))
                cache.clear()
                cache.update(fresh)
                for obj in fresh.values():
                    self._enqueue(kind, obj)
                self.synced[kind].set()
                self.failing.pop(kind, None)
                rv = listing["metadata"]["resourceVersion"]
                while True:
                    async for kind_of_event, obj in self.kube.stream(
                        kind, self.s.namespace, rv, self.s.node_selector
                    ):
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if kind_of_event == "BOOKMARK":
                            continue
                        if kind_of_event == "DELETED":
                            cache.pop(obj["metadata"]["name"], None)
                        else:
                            self._store(cache, obj)
                        self._enqueue(kind, obj)
                    delay = 1.0
            except Gone:
                log.info("watch_expired", kind=kind)
            except TemporaryError as e:
                log.warning("watch_failed", kind=kind, error=str(e), retry_in_s=delay)
                self.failing[kind] = str(e)[:300]
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    # ------------------------------------------------------------------ decisions
    def _views(self, node: str) -> list[reconcile.JobView]:
        views = []
        for job in self.jobs.values():
            if job_node(job) == node:
                view = job_view(job)
                if view is not None:
                    views.append(view)
        return views

    def desired_layout(self, name: str) -> partitioning.Desired | None:
        labels = self.nodes[name]["metadata"].get("labels") or {}
        where = f"ConfigMap {self.s.namespace}/{self.s.layouts_configmap}"
        return partitioning.desired(labels.get(self.s.layout_label_key), self.layouts, where)

    def active_jobs(self) -> int:
        running = sum(1 for j in self.jobs.values() if (v := job_view(j)) and v.phase == "running")
        return running + self._reserved

    def step_for(self, name: str) -> reconcile.Step | partitioning.Refuse | None:
        """The next step for the node: its features' action first, then its partition layout;
        one agent Job of the node at a time, whichever it is for."""
        node = self.nodes.get(name)
        if node is None:
            return None
        meta = node["metadata"]
        labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
        view = reconcile.NodeView(
            name=name,
            desired="enable" if labels.get(self.s.label_key) == self.s.label_value else "disable",
            status=status.parse(ann.get(names.STATUS_ANNOTATION)),
            retry_requested=names.RETRY_ANNOTATION in ann,
        )
        views = self._views(name)
        features = [v for v in views if v.action in names.FEATURE_ACTIONS]
        layouts = [v for v in views if v.action == partitioning.ACTION]
        now = time.time()
        step = reconcile.decide(view, features, self.active_jobs(), self.policy, now)
        if not isinstance(step, (reconcile.InSync, reconcile.Wait)):
            return step
        if any(v.phase == "running" for v in features):
            return step
        partition = partitioning.decide(
            self.desired_layout(name),
            partitioning.parse_status(ann.get(names.PARTITION_STATUS_ANNOTATION)),
            layouts,
            active=self.active_jobs(),
            policy=self.policy,
            now=now,
            wait_interval=self.s.partition_wait_interval,
            retry_requested=names.RETRY_ANNOTATION in ann,
        )
        if isinstance(partition, reconcile.InSync):
            return step
        if isinstance(partition, reconcile.Create) and any(v.phase == "running" for v in views):
            return reconcile.Wait("another agent Job of the node runs")
        if isinstance(partition, reconcile.Wait) and isinstance(step, reconcile.Wait):
            # The sooner of the two requeues, so neither waits for the other.
            times = [s.after_s for s in (step, partition) if s.after_s is not None]
            return reconcile.Wait(partition.reason, min(times) if times else None)
        return partition

    # ------------------------------------------------------------------ steps
    async def _create(self, name: str, step: reconcile.Create) -> None:
        self._reserved += 1
        try:
            if step.replaces is not None:
                await self.kube.delete_job(self.s.namespace, step.replaces.name)
                self.jobs.pop(step.replaces.name, None)
            if step.clear_retry:
                self._store(
                    self.nodes, await self.kube.annotate_node(name, {names.RETRY_ANNOTATION: None})
                )
            layout = None
            if step.action == partitioning.ACTION:
                want = self.desired_layout(name)
                layout = want.layout if want is not None else None
                if layout is None:
                    return  # the label or the ConfigMap changed since the decision: ask again
            manifest = job_spec.manifest(self.template, name, step.action, step.attempt, layout)
            self._store(self.jobs, await self.kube.create_job(manifest))
        finally:
            self._reserved -= 1
        self.metrics.jobs_created.labels(step.action).inc()
        log.info(
            "job_created",
            node=name,
            action=step.action,
            attempt=step.attempt,
            job=manifest["metadata"]["name"],
        )

    async def _outcome(self, name: str, job: reconcile.JobView) -> status.Outcome:
        """The finished Job's outcome, judged from its agent's result (see status.outcome)."""
        ended = await self.kube.agent_ended(self.s.namespace, job.name, job.uid)
        return status.outcome(
            job=job.name,
            namespace=self.s.namespace,
            action=job.action,
            node=name,
            completed=job.phase == "succeeded",
            ended=ended,
            detail=job.detail,
        )

    async def _refuse(self, name: str, step: partitioning.Refuse) -> None:
        want = step.desired
        st = partitioning.PartitionStatus(
            layout=want.name,
            digest=want.digest,
            result="refused",
            time=_now(),
            reason="LayoutRefused",
            message=want.error[: partitioning.MAX_TEXT],
            retry="fix the layout or the node's label; nothing was changed on the node",
        )
        node = await self.kube.annotate_node(
            name, {names.PARTITION_STATUS_ANNOTATION: st.to_json()}
        )
        self._store(self.nodes, node)
        await self.kube.node_event(
            node, "PartitionLayoutRefused", "Warning", f"{want.error}; nothing was changed"
        )
        self.metrics.actions.labels(partitioning.ACTION, "refused").inc()
        log.warning("partition_layout_refused", node=name, layout=want.name, error=want.error)

    async def _record_partition(self, name: str, step: reconcile.Record) -> None:
        job = step.job
        before = partitioning.parse_status(
            (self.nodes[name]["metadata"].get("annotations") or {}).get(
                names.PARTITION_STATUS_ANNOTATION
            )
        )
        out = await self._outcome(name, job)
        result = partitioning.result_of(out.succeeded, out.reason)
        retry = {
            "succeeded": "",
            "refused": "fix the layout or the node's label, or annotate the node "
            f"{names.RETRY_ANNOTATION}=now",
            "waiting": f"next try in {self.s.partition_wait_interval:g} s",
            "failed": step.retry,
        }[result]
        st = partitioning.PartitionStatus(
            layout=job.layout,
            digest=job.digest,
            result=result,
            time=_now(),
            job=job.name,
            job_uid=job.uid,
            attempt=job.attempt,
            reason=out.reason,
            message=out.message[: partitioning.MAX_TEXT],
            retry=retry,
        )
        node = await self.kube.annotate_node(
            name, {names.PARTITION_STATUS_ANNOTATION: st.to_json()}
        )
        self._store(self.nodes, node)
        reason, kind = {
            "succeeded": ("PartitionConverged", "Normal"),
            "waiting": ("PartitionWaiting", "Normal"),
            "refused": ("PartitionLayoutRefused", "Warning"),
            "failed": ("PartitionFailed", "Warning"),
        }[result]
        text = f"layout {job.layout} (Job {job.name}, try {job.attempt}): {out.message}"
        if retry:
            text += f"; {retry}"
        # A layout that keeps waiting for the same pods says so once, not every try: the
        # annotation carries each try, the Event the first and every change of what blocks it.
        again = (
            result == "waiting"
            and before is not None
            and (before.layout, before.digest, before.result, before.message)
            == (st.layout, st.digest, st.result, st.message)
        )
        if not again:
            await self.kube.node_event(node, reason, kind, text)
        self.metrics.actions.labels(job.action, result).inc()
        if job.finished and result == "succeeded":
            self.metrics.duration.labels(job.action).observe(max(job.finished - job.created, 0))
        (log.info if result in ("succeeded", "waiting") else log.warning)(
            "partition_" + result,
            node=name,
            layout=job.layout,
            job=job.name,
            attempt=job.attempt,
            reason=out.reason,
            message=out.message,
        )
        if result in ("succeeded", "refused"):
            await self.kube.delete_job(self.s.namespace, job.name)
            self.jobs.pop(job.name, None)

    async def _record(self, name: str, step: reconcile.Record) -> None:
        job = step.job
        if job.action == partitioning.ACTION:
            await self._record_partition(name, step)
            return
        out = await self._outcome(name, job)
        result = "succeeded" if out.succeeded else "failed"
        retry = "" if out.succeeded else step.retry
        st = status.Status(
            action=job.action,
            result=result,
            time=_now(),
            job=job.name,
            job_uid=job.uid,
            attempt=job.attempt,
            agent_version=out.agent_version,
            reason=out.reason,
            message=out.message,
            retry=retry,
        )
        node = await self.kube.annotate_node(name, {names.STATUS_ANNOTATION: st.to_json()})
        self._store(self.nodes, node)
        reason = "ActionSucceeded" if out.succeeded else "ActionFailed"
        text = f"{job.action} {result} (Job {job.name}, try {job.attempt}): {out.message}"
        if retry:
            text += f"; {retry}"
        await self.kube.node_event(node, reason, "Normal" if out.succeeded else "Warning", text)
        self.metrics.actions.labels(job.action, result).inc()
        if job.finished:
            self.metrics.duration.labels(job.action).observe(max(job.finished - job.created, 0))
        (log.info if out.succeeded else log.warning)(
            "action_" + result,
            node=name,
            action=job.action,
            job=job.name,
            attempt=job.attempt,
            job_condition=job.phase,
            reason=out.reason,
            message=out.message,
        )
        if out.succeeded:
            await self.kube.delete_job(self.s.namespace, job.name)
            self.jobs.pop(job.name, None)

    async def reconcile(self, name: str) -> None:
        """Take steps for ``name`` until it is in sync or must wait."""
        for _ in range(8):
            step = self.step_for(name)
            if step is None or isinstance(step, reconcile.InSync):
                return
            if isinstance(step, reconcile.Wait):
                if step.after_s is not None:
                    self.queue.add_after(name, step.after_s)
                return
            if isinstance(step, partitioning.Refuse):
                await self._refuse(name, step)
            elif isinstance(step, reconcile.Create):
                await self._create(name, step)
            elif isinstance(step, reconcile.Record):
                await self._record(name, step)
            elif isinstance(step, reconcile.Delete):
                await self.kube.delete_job(self.s.namespace, step.job.name)
                self.jobs.pop(step.job.name, None)
                log.info("job_deleted", node=name, job=step.job.name, reason=step.reason)

    async def worker(self) -> None:
        for kind in self.synced:
            await self.synced[kind].wait()
        while True:
            name = await self.queue.get()
            self.metrics.queue_depth.set(len(self.queue))
            try:
                await self.reconcile(name)
            except TemporaryError as e:
                self.metrics.reconcile_errors.inc()
                log.warning("reconcile_retry", node=name, error=str(e))
                self.queue.add_after(name, max(e.delay, 1.0))
            except PermanentError as e:
                self.metrics.reconcile_errors.inc()
                log.error("reconcile_failed", node=name, error=str(e), retry_in_s=30)
                self.queue.add_after(name, 30.0)
            finally:
                self.queue.done(name)
                self.metrics.active_jobs.set(self.active_jobs())
