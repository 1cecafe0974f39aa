"""The feed: nodes, NodeDevices and pods into the state and the queue, ResourceSlices and
ResourceClaims into its DRA ledger (nodes in DRA mode, :mod:`.dra`), claims, PVs and the
storage objects into its storage cache (:mod:`.storage`), namespaces' labels (inter-pod terms'
namespaceSelector), PodDisruptionBudgets for preemption, PodGroups (``scheduling.k8s.io/v1beta1``)
for gangs and, when the default spread constraints need them, the selectors of Services and pod
controllers (:mod:`.workloads`), one informer each.

Each kind is listed, then watched from the list's resourceVersion (``informer.py``); a closed
stream is resumed, an expired resourceVersion (410) relists, an unreachable apiserver is retried
with the suite's backoff (1 s, ×2, 30 s), resuming the watch where it was. A malformed object is
logged and skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

import structlog

from . import budgets, objects, storage, workloads
from .errors import PermanentError, TemporaryError
from .informer import Informer
from .kube import Gone, Json, Kube
from .plugins import pod_topology_spread
from .queue import SchedulingQueue
from .scheduler import Recorder
from .settings import Settings
from .state import ClusterState

log = structlog.get_logger("lj_runtimekit_scheduler.informer")

KINDS = (
    "nodes",
    "nodedevices",
    "pods",
    "resourceslices",
    "resourceclaims",
    *storage.KINDS,
    "namespaces",
    "poddisruptionbudgets",
    "podgroups",
)
OPTIONAL = (
    "resourceslices",
    "resourceclaims",
    *storage.KINDS,
    "namespaces",
    *workloads.KINDS,
    "poddisruptionbudgets",
    "podgroups",
)
"""Kinds a cluster may not serve (or the scheduler's role, or an older RBAC, may not grant): it
starts without them. Pods without claims never wait for the storage kinds; a pod with claims
waits until they are listed (VolumeBinding says so)."""


def kinds(settings: Settings) -> tuple[str, ...]:
    """The kinds watched: the workloads only when default spread constraints may apply."""
    spreads = any(p.name == pod_topology_spread.NAME for p in settings.plugins)
    system = settings.spread_defaulting == pod_topology_spread.SYSTEM
    defaults = system or bool(settings.spread_default_constraints)
    return KINDS + (workloads.KINDS if spreads and defaults else ())


class Informers:
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        state: ClusterState,
        queue: SchedulingQueue,
        poke: Callable[[], None],
        *,
        recorder: Recorder | None = None,
    ) -> None:
        self.kube, self.settings, self.state, self.queue = kube, settings, state, queue
        self.poke = poke
        self.recorder = recorder
        """Where a bound pod's edited assignment is reported (None: logged only)."""
        self.informers = {
            kind: Informer(
                kind,
                partial(self._list, kind),
                partial(self._watch, kind),
                partial(self._handle, kind),
                on_relist=partial(self._relist, kind),
                gone=(Gone,),
                retry=(TemporaryError, PermanentError),
                on_error=partial(self._failed, kind),
                resume_after_error=True,
                log=log,
            )
            for kind in kinds(settings)
        }
        self.synced = {k: i.synced for k, i in self.informers.items()}
        self._handlers: dict[str, Callable[[str, Json], None]] = {
            "nodes": self._node,
            "nodedevices": self._devices,
            "pods": self._pod,
            "resourceslices": self._slice,
            "resourceclaims": self._claim,
            **{k: partial(self._storage, k) for k in storage.KINDS},
            "namespaces": self._namespace,
            **{k: partial(self._workload, k) for k in workloads.KINDS},
            "poddisruptionbudgets": self._budget,
            "podgroups": self._pod_group,
        }

    @property
    def failing(self) -> dict[str, str]:
        """Kind → why its list/watch fails now; /healthz shows it (the rest keeps serving)."""
        return {k: i.failing for k, i in self.informers.items() if i.failing is not None}

    async def wait_synced(self) -> None:
        await asyncio.gather(*(e.wait() for e in self.synced.values()))

    async def run(self, kind: str) -> None:
        await self.informers[kind].run()

    async def _list(self, kind: str) -> tuple[Sequence[Json], str]:
        listed, rv = await self.kube.list(kind)
        return [i for i in listed if isinstance(i, dict)], rv

    async def _watch(self, kind: str, rv: str) -> AsyncIterator[tuple[str, Json]]:
        async for ev in self.kube.watch(kind, rv):
            obj = ev.get("object")
            if not isinstance(obj, dict):
                raise TemporaryError(f"watch {kind}: event object is not a JSON object")
            yield str(ev.get("type")), obj

    def _failed(self, kind: str, e: BaseException) -> None:
        # PermanentError here is mostly a missing CRD or RBAC: said in failing, tried again
        if kind in OPTIONAL and isinstance(e, PermanentError):
            # a cluster without resource.k8s.io/v1 (or without our rights to it) has no node
            # in DRA mode: schedule without, keep trying
            self.synced[kind].set()

    def _relist(self, kind: str, items: Sequence[Json]) -> None:
        """Before the list is replayed: drop from the state what it no longer holds (a delete
        made while the watch was away is in no event: a 410 relist is the only news of it)."""
        if kind == "nodes":
            names = {m.get("name") for i in items if isinstance(m := i.get("metadata"), dict)}
            for name in [n for n in self.state.nodes if n not in names]:
                self.state.remove_node(name)
        elif kind == "nodedevices":
            listed = {_devices_node(i) for i in items}
            for name in [n for n in self.state.devices if n not in listed]:
                self.state.set_devices(name, ())
        elif kind == "pods":
            seen = {m.get("uid") for i in items if isinstance(m := i.get("metadata"), dict)}
            for uid in [u for u in self.state.pods if u not in seen]:
                self.state.remove_pod(uid)
        elif kind == "resourceslices":
            names = {m.get("name") for i in items if isinstance(m := i.get("metadata"), dict)}
            for name in [n for n in self.state.dra.slices if n not in names]:
                self.state.set_slice(name, None)
        elif kind == "resourceclaims":
            seen = {m.get("uid") for i in items if isinstance(m := i.get("metadata"), dict)}
            for uid in [u for u in self.state.dra.claims if u not in seen]:
                self.state.set_claim(None, uid)
        elif kind in storage.KINDS:
            self.state.storage.relist(kind, items)
        elif kind == "namespaces":
            self.state.namespace_labels.clear()
        elif kind in workloads.KINDS:
            self.state.workloads.clear(kind)
        elif kind == "poddisruptionbudgets":
            seen = {m.get("uid") for i in items if isinstance(m := i.get("metadata"), dict)}
            for uid in [u for u in self.state.budgets if u not in seen]:
                del self.state.budgets[uid]
        elif kind == "podgroups":
            keys = {
                f"{m.get('namespace')}/{m.get('name')}"
                for i in items
                if isinstance(m := i.get("metadata"), dict)
            }
            for key in [k for k in self.state.pod_groups if k not in keys]:
                del self.state.pod_groups[key]

    def _handle(self, kind: str, ev_type: str, obj: Json) -> None:
        try:
            self._handlers[kind](ev_type, obj)
        except (KeyError, ValueError, TypeError, AttributeError, ArithmeticError) as e:
            # Any shape a user or a broken writer can give: skip the object, name it, go on.
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            log.warning("object_malformed", kind=kind, name=name, error=repr(e)[:300])

    def _node(self, ev_type: str, obj: Json) -> None:
        if ev_type == "DELETED":
            self.state.remove_node(obj["metadata"]["name"])
            return
        self.state.set_node(objects.node(obj))
        self._changed()

    def _devices(self, ev_type: str, obj: Json) -> None:
        refused: list[str] = []
        node, devices = objects.node_devices(obj, self.settings.resources, refused)
        for why in refused if ev_type != "DELETED" else ():
            log.warning("node_devices_value_refused", node=node, why=why)
        if ev_type == "DELETED":
            self.state.set_devices(node, ())
        else:
            self.state.set_devices(node, devices, objects.confirms_allocations(obj))
        self._changed()

    def _slice(self, ev_type: str, obj: Json) -> None:
        name = obj["metadata"]["name"]
        self.state.set_slice(name, None if ev_type == "DELETED" else obj)
        self._changed()

    def _claim(self, ev_type: str, obj: Json) -> None:
        if ev_type == "DELETED":
            self.state.set_claim(None, str(obj["metadata"]["uid"]))
        else:
            self.state.set_claim(obj)
        self._changed()

    def _storage(self, kind: str, ev_type: str, obj: Json) -> None:
        self.state.storage.apply(kind, ev_type, obj)
        if ev_type != "DELETED":
            # a claim bound, a PV or class added, a CSI node or capacity changed may let a pod
            # with claims in (kube-scheduler's VolumeBinding events: Add and Update only)
            self._changed()

    def _namespace(self, ev_type: str, obj: Json) -> None:
        name = obj["metadata"]["name"]
        if ev_type == "DELETED":
            self.state.namespace_labels.pop(name, None)
        else:
            raw = obj["metadata"].get("labels") or {}
            if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
                raise ValueError(f"namespace {name}: labels are not a map of strings")
            if self.state.namespace_labels.get(name) == raw:
                return
            self.state.namespace_labels[name] = raw
        self._changed()

    def _workload(self, kind: str, ev_type: str, obj: Json) -> None:
        meta = obj["metadata"]
        ns, name = str(meta.get("namespace", "default")), str(meta["name"])
        if ev_type == "DELETED":
            self.state.workloads.delete(kind, ns, name)
        else:
            self.state.workloads.put(kind, ns, name, workloads.selector_of(kind, obj))

    def _budget(self, ev_type: str, obj: Json) -> None:
        uid = str(obj["metadata"]["uid"])
        if ev_type == "DELETED":
            self.state.budgets.pop(uid, None)
        else:
            self.state.budgets[uid] = budgets.budget(obj)

    def _pod_group(self, ev_type: str, obj: Json) -> None:
        meta = obj["metadata"]
        key = f"{meta.get('namespace', 'default')}/{meta['name']}"
        if ev_type == "DELETED":
            self.state.pod_groups.pop(key, None)
            return
        group = objects.pod_group(obj)
        before = self.state.pod_groups.get(key)
        self.state.pod_groups[key] = group
        if before is None or before.min_count != group.min_count:
            self._changed()  # its pods waited for it, or for another minCount

    def _pod(self, ev_type: str, obj: Json) -> None:
        pod = objects.pod(obj, self.settings.resources)
        if ev_type == "DELETED":
            self.queue.delete(pod.uid)
            nominated = self.state.unnominate(pod.uid) is not None
            if pod.uid in self.state.pods:
                self.state.remove_pod(pod.uid)
                self._changed()
            elif nominated:
                self._changed()  # the room it held is free
            return
        ours = pod.scheduler_name == self.settings.scheduler_name
        if ours and not pod.node_name and not pod.deleting and pod.phase == "Pending":
            if pod.uid not in self.state.assumed:
                first = self.queue.get(pod.uid) is None and pod.uid not in self.state.nominated
                if pod.nominated_node and first:
                    # first seen (a restart, a new leader): it keeps the room a preemption made
                    self.state.nominate(pod, pod.nominated_node, None)
                self.queue.add(pod, time.monotonic())
                self.poke()
            return
        self.queue.delete(pod.uid)
        self.state.unnominate(pod.uid)  # bound (or ended): a nomination is for a pending pod
        held, was_pending = pod.uid in self.state.pods, self.state.is_pending(pod.uid)
        assumed = pod.uid in self.state.assumed
        # another scheduler's pod with our annotation is counted by its requests, not told
        if (edited := self.state.observe_pod(pod)) is not None and ours:
            msg = edited.message()
            log.warning("gpu_assignment_edited", pod=pod.key, node=pod.node_name, why=msg)
            if self.recorder is not None:
                self.recorder.event(pod, "Warning", "GpuAssignmentEdited", msg)
        # a pod bound (seen first, or our assumption confirmed): pods whose required pod
        # affinity waits for one like it may fit now (kube-scheduler's queueing hint)
        placed = (not held or assumed) and pod.uid in self.state.pods
        if placed and self.queue.pod_placed(time.monotonic()):
            self.poke()
        if held and pod.uid not in self.state.pods:
            self._changed()  # a pod finished: its resources are free again
        elif was_pending and not self.state.is_pending(pod.uid):
            # the device plugin confirmed it: pods of the same request may go to its node now,
            # and a gang member bound after it may be bound (the scheduler waits on poke)
            self.queue.cluster_changed(time.monotonic())
            self.poke()

    def _changed(self) -> None:
        if self.queue.cluster_changed(time.monotonic()):
            self.poke()


def tasks(inf: Informers) -> dict[str, Any]:
    return {f"informer-{k}": inf.run(k) for k in inf.informers}


def _devices_node(raw: Json) -> str | None:
    """The node a NodeDevices object speaks for (its ``spec.nodeName``, else its name)."""
    spec, meta = raw.get("spec"), raw.get("metadata")
    name = spec.get("nodeName") if isinstance(spec, dict) else None
    if not name and isinstance(meta, dict):
        name = meta.get("name")
    return name if isinstance(name, str) else None
