"""The action loop: caches of nodes, agent Jobs and the layouts ConfigMap from informers, and
workers that reconcile a node by performing the steps :mod:`.steps` decides."""

from __future__ import annotations

import shlex
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from functools import partial

import structlog

from . import fence, job_spec, names, partitioning, reconcile, status, steps
from .errors import PermanentError, TemporaryError
from .informer import Informer
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
        self.informers = {
            kind: Informer(
                kind,
                partial(self._list, kind),
                partial(self._watch, kind),
                partial(self._event, kind),
                on_relist=partial(self._relist, kind),
                gone=(Gone,),
                retry=(TemporaryError,),
                log=log,
            )
            for kind in ("nodes", "jobs", "configmaps")
        }
        self._reserved = 0
        self._recorded: set[str] = set()
        """Uids of the finished agent Jobs whose result this controller wrote on their node."""
        self.vouched: dict[str, dict[str, str]] = {}
        """Node → status annotation key → the value this controller wrote there from its own
        agent Job's result: the only status it believes (:func:`steps.next_step`)."""
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

    @property
    def failing(self) -> dict[str, str]:
        """Kind → why its list/watch fails now (shown in /healthz; the rest keeps working)."""
        return {k: i.failing for k, i in self.informers.items() if i.failing is not None}

    async def sync(self, kind: str) -> None:
        """List, then watch ``kind`` forever (``informer.py``)."""
        await self.informers[kind].run()

    # ------------------------------------------------------------------ caches
    async def _list(self, kind: str) -> tuple[Sequence[Obj], str]:
        if kind == "configmaps":
            listing = await self.kube.list_configmap(self.s.namespace, self.s.layouts_configmap)
        elif kind == "nodes":
            listing = await self.kube.list_nodes(self.s.node_selector)
        else:
            listing = await self.kube.list_jobs(self.s.namespace)
        return listing.get("items") or [], listing["metadata"]["resourceVersion"]

    def _watch(self, kind: str, rv: str) -> AsyncIterator[tuple[str, Obj]]:
        if kind == "configmaps":
            return self.kube.stream(kind, self.s.namespace, rv, name=self.s.layouts_configmap)
        return self.kube.stream(kind, self.s.namespace, rv, self.s.node_selector)

    def _relist(self, kind: str, items: Sequence[Obj]) -> None:
        """Before the list is replayed: drop (and queue) what it no longer holds."""
        if kind == "configmaps":
            if not items:
                self._set_layouts(None)
            return
        cache = self.nodes if kind == "nodes" else self.jobs
        fresh = {o["metadata"]["name"]: o for o in items}
        for gone in set(cache) - set(fresh):
            self._enqueue(kind, cache.pop(gone))
            if kind == "nodes":
                self.vouched.pop(gone, None)
        cache.clear()
        cache.update(fresh)
        if kind == "jobs":
            self._recorded &= {o["metadata"].get("uid", "") for o in items}

    def _event(self, kind: str, kind_of_event: str, obj: Obj) -> None:
        if kind == "configmaps":
            self._set_layouts(None if kind_of_event == "DELETED" else obj)
            return
        cache = self.nodes if kind == "nodes" else self.jobs
        if kind_of_event == "DELETED":
            cache.pop(obj["metadata"]["name"], None)
            if kind == "jobs":
                self._recorded.discard(obj["metadata"].get("uid", ""))
            if kind == "nodes":
                self.vouched.pop(obj["metadata"]["name"], None)
        else:
            self._store(cache, obj)
        self._enqueue(kind, obj)

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
        """The agent Jobs that hold a slot of ``max_active_jobs``: running ones, finished ones
        whose result this controller has not yet recorded on their node (a Job is done with only
        once its result is written and, when it succeeded, it is deleted; counting it until then
        keeps the limit a bound on the Jobs that exist, however far recording lags behind under
        load), and creations in flight."""
        held = self._reserved
        for j in self.jobs.values():
            v = job_view(j)
            if v is None:
                continue
            unrecorded = v.uid not in self._recorded and job_node(j) in self.nodes
            if v.phase == "running" or unrecorded:
                held += 1
        return held

    def step_for(self, name: str) -> steps.NextStep | None:
        """The next step for the node (:func:`steps.next_step`); None when it is gone."""
        node = self.nodes.get(name)
        if node is None:
            return None
        meta = node["metadata"]
        return steps.next_step(
            name,
            meta.get("labels") or {},
            meta.get("annotations") or {},
            self._views(name),
            self.desired_layout(name),
            feature_label=(self.s.label_key, self.s.label_value),
            active=self.active_jobs(),
            policy=self.policy,
            now=time.time(),
            wait_interval=self.s.partition_wait_interval,
            vouched=self.vouched.get(name, {}),
        )

    async def _write_status(self, name: str, key: str, value: str) -> Obj:
        """Annotate the node with a status, vouched for from now on."""
        node = await self.kube.annotate_node(name, {key: value})
        self._store(self.nodes, node)
        self.vouched.setdefault(name, {})[key] = value
        return node

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
            first_look = False
            if step.action == partitioning.ACTION:
                want = self.desired_layout(name)
                layout = want.layout if want is not None else None
                if want is None or layout is None:
                    return  # the label or the ConfigMap changed since the decision: ask again
                # not fenced for this layout yet: the agent reports the GPUs in use at once, so
                # they are fenced from new pods before any try waits for them
                held = self._fence_of(name)
                first_look = held is None or (held.layout, held.digest) != (want.name, want.digest)
            manifest = job_spec.manifest(
                self.template, name, step.action, step.attempt, layout, first_look=first_look
            )
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
        node = await self._write_status(name, names.PARTITION_STATUS_ANNOTATION, st.to_json())
        await self.kube.node_event(
            node, "PartitionLayoutRefused", "Warning", f"{want.error}; nothing was changed"
        )
        self.metrics.actions.labels(partitioning.ACTION, "refused").inc()
        log.warning("partition_layout_refused", node=name, layout=want.name, error=want.error)

    async def _record(self, name: str, step: reconcile.Record) -> None:
        """Write a finished Job's outcome on its node (:func:`steps.recording` says what)."""
        job = step.job
        before = partitioning.parse_status(
            (self.nodes[name]["metadata"].get("annotations") or {}).get(
                names.PARTITION_STATUS_ANNOTATION
            )
        )
        out = await self._outcome(name, job)
        rec = steps.recording(
            name,
            step,
            out,
            before=before,
            now_text=_now(),
            wait_interval=self.s.partition_wait_interval,
        )
        node = await self._write_status(name, *rec.annotation)
        self._recorded.add(job.uid)
        if rec.event is not None:
            await self.kube.node_event(node, *rec.event)
        if rec.fence is not None:
            await self._fence(name, rec.fence)
        self.metrics.actions.labels(job.action, rec.result).inc()
        if rec.observe_duration and job.finished:
            self.metrics.duration.labels(job.action).observe(max(job.finished - job.created, 0))
        (log.info if rec.ok else log.warning)(rec.log_event, **rec.log_fields)
        if rec.delete_job:
            await self.kube.delete_job(self.s.namespace, job.name)
            self.jobs.pop(job.name, None)

    def _fence_of(self, name: str) -> fence.Fence | None:
        annotations = self.nodes[name]["metadata"].get("annotations") or {}
        return fence.parse(annotations.get(names.FENCE_ANNOTATION))

    async def _fence(self, name: str, want: fence.Fence) -> None:
        """Record the fence of a waiting layout on the node; an Event when it is new or fences
        other GPUs or pods than before (not at every try of the same wait)."""
        if not want.devices:
            return
        old = self._fence_of(name)
        if want.same_as(old):
            return
        node = await self.kube.annotate_node(name, {names.FENCE_ANNOTATION: want.to_json()})
        self._store(self.nodes, node)
        await self.kube.node_event(node, "PartitionFenced", "Normal", fence.fenced_message(want))
        log.info(
            "partition_fenced",
            node=name,
            layout=want.layout,
            devices=list(want.devices),
            held_by=list(want.held_by),
        )

    async def _lift_fence(self, name: str) -> None:
        """Lift the node's fence once its change is done or abandoned (:func:`fence.lift_reason`),
        judged from the partition status this controller vouches for."""
        node = self.nodes.get(name)
        current = self._fence_of(name) if node is not None else None
        if node is None or current is None:
            return
        annotations = node["metadata"].get("annotations") or {}
        text = annotations.get(names.PARTITION_STATUS_ANNOTATION)
        vouched = self.vouched.get(name, {}).get(names.PARTITION_STATUS_ANNOTATION)
        believed = partitioning.parse_status(text) if text is not None and text == vouched else None
        why = fence.lift_reason(current, self.desired_layout(name), believed)
        if why is None:
            return
        node = await self.kube.annotate_node(name, {names.FENCE_ANNOTATION: None})
        self._store(self.nodes, node)
        await self.kube.node_event(
            node, "PartitionUnfenced", "Normal", fence.lifted_message(current, why)
        )
        log.info("partition_unfenced", node=name, devices=list(current.devices), reason=why)

    async def _forget(self, name: str) -> None:
        """The node left the cache: once the apiserver confirms it is gone (it may only have left
        ``node_selector``), delete its agent Jobs, running or not, so that none outlives its node
        or holds a slot of ``max_active_jobs``."""
        jobs = self._views(name)
        if not jobs or await self.kube.node_exists(name):
            return
        for job in jobs:
            await self.kube.delete_job(self.s.namespace, job.name)
            self.jobs.pop(job.name, None)
            log.info("job_deleted", node=name, job=job.name, reason="its node is gone")

    async def reconcile(self, name: str) -> None:
        """Take steps for ``name`` until it is in sync or must wait."""
        for _ in range(8):
            await self._lift_fence(name)
            step = self.step_for(name)
            if step is None:
                await self._forget(name)
                return
            if isinstance(step, reconcile.InSync):
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
        for informer in self.informers.values():
            await informer.synced.wait()
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
