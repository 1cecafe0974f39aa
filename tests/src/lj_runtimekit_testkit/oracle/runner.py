"""Cases on a real apiserver, in batches, under kube-scheduler and ours at once.

A batch holds up to ``width`` cases; each case gets two copies (kube-scheduler's and ours),
each with its own nodes, its own namespace (from a pool of ``2 × width``) and its own topology
values, so copies cannot see each other's pods or domains. One batch:

1. create the copies' nodes (and NodeDevices), then the pods already bound to them;
2. wait, in the API, until KWOK reports every node Ready, lift the not-ready taint the apiserver
   puts on a new node (kube-controller-manager would, at 20 writes/s) and see every node as it
   will stay (a cordoned one is created with the unschedulable taint it would add);
3. **barrier**: label the *sentinel* node with a fresh token, then create one pod per scheduler
   that only the sentinel with that token can take. A scheduler that binds it has seen that
   label, so (one watch per kind, in resourceVersion order) every node write before it, and the
   pod itself, so every pod write before it: its cache holds the whole batch. No sleep, no
   counting: the barrier is the schedulers' own order of events;
4. read the cluster back (the checker judges from what the apiserver holds), create the probes,
   and wait until each is bound or refused (kube-scheduler's ``PodScheduled`` condition, our
   FailedScheduling Event; a gated pod's condition is the apiserver's);
5. a second barrier (both schedulers have popped every probe), one last look for verdicts that
   changed since, then delete the batch's pods and nodes and wait until they are gone.

Everything a run makes carries its run label; ``close`` deletes it all.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.oracle import gpu, messages
from lj_runtimekit_testkit.oracle.cases import (
    BATCH_LABEL,
    KUBE,
    KWOK_ANNOTATION,
    OURS,
    PREFIX,
    RUN_LABEL,
    Case,
    Copy,
    node_devices_manifest,
    node_manifest,
    pod_manifest,
)
from lj_runtimekit_testkit.oracle.judge import (
    BOUND,
    GATED,
    PRESET,
    REFUSED,
    UNDECIDED,
    Finding,
    Observed,
    Snapshot,
    judge_pair,
)
from lj_runtimekit_testkit.oracle.messages import Refusal
from lj_runtimekit_testkit.oracle.ours import DEFAULT_NAME
from lj_runtimekit_testkit.oracle.streams import Stream

Json = dict[str, Any]
KUBE_SCHEDULER = "default-scheduler"
BARRIER_LABEL = f"{PREFIX}/barrier"
BARRIER_TAINT = {"key": BARRIER_LABEL, "value": "only", "effect": "NoSchedule"}
NOT_READY = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
DEVICES = ("lj-runtimekit.aliyun.com", "v1", "nodedevices")


@dataclass
class CaseResult:
    case: Case
    observed: list[Observed]
    findings: list[Finding]
    snapshot: Snapshot
    """The cluster the probes met (for GPU cases: as it ended), to judge again."""


@dataclass
class Timings:
    batches: int = 0
    phases: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, since: float) -> float:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    def line(self) -> str:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        return f"{self.batches} batches: {parts}"


def _wait(cond: threading.Condition, what: str, check: Callable[[], Any], deadline_s: float) -> Any:
    deadline = time.monotonic() + deadline_s
    with cond:
        while not (result := check()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what} not within {deadline_s:.0f} s")
            cond.wait(min(left, 1.0))
        return result


def _read(resp: Any) -> bytes:
    """The whole answer, read before its connection goes back to the pool (unread bytes would
    be the next request's answer)."""
    return bytes(resp.data)


def _ready(node: Json) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _taint_keys(node: Json) -> set[str]:
    return {t["key"] for t in (node.get("spec") or {}).get("taints") or ()}


def _node_settled(node: Json) -> bool:
    taints = _taint_keys(node)
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return _ready(node) and NOT_READY not in taints and cordoned == (UNSCHEDULABLE_TAINT in taints)


class Harness:
    """Runs cases on ``cluster`` with kube-scheduler and our scheduler (already running, by the
    name ``ours``)."""

    def __init__(
        self, cluster: Cluster, *, ours: str = DEFAULT_NAME, width: int = 16, run: str = ""
    ) -> None:
        self.cluster, self.ours, self.width = cluster, ours, width
        self.run = run or uuid.uuid4().hex[:6]
        # Any: raw JSON in and out (_preload_content=False), past the typed models
        self.api: Any = cluster.api_client(pool_size=48)
        self.stream_api: Any = cluster.api_client(pool_size=8)
        """The streams' own connections (a watch's connection is closed, never pooled)."""
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.pool = ThreadPoolExecutor(12)
        self.changed = threading.Condition()
        self.sentinel = f"oracle-{self.run}-sentinel"
        self.barrier_ns = f"oracle-{self.run}-barrier"
        self.namespaces = {
            (i, who): f"oracle-{self.run}-{i}{who}" for i in range(width) for who in (KUBE, OURS)
        }
        self.timings = Timings()
        self.streams: list[Stream] = []
        self._batch = 0

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> Harness:
        """The streams, the namespaces and the sentinel node; on failure, what was made is
        deleted again."""
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def _open(self) -> None:
        selector = f"{RUN_LABEL}={self.run}"
        watching: Any = client.CoreV1Api(self.stream_api)
        self.pods = Stream(
            watching.list_pod_for_all_namespaces, "pods", self.changed, label_selector=selector
        )
        self.streams.append(self.pods)
        self.nodes = Stream(watching.list_node, "nodes", self.changed, label_selector=selector)
        self.streams.append(self.nodes)
        self.events = Stream(
            watching.list_event_for_all_namespaces,
            "events",
            self.changed,
            field_selector="reason=FailedScheduling",
        )
        self.streams.append(self.events)
        names = [self.barrier_ns, *self.namespaces.values()]
        list(self.pool.map(self._namespace, names))
        sentinel = self._sentinel_manifest()
        self._create_node(sentinel)
        self._settle({self.sentinel: sentinel["spec"]["taints"]})

    def _sentinel_manifest(self) -> Json:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.sentinel,
                "labels": {RUN_LABEL: self.run, "type": "kwok"},
                "annotations": {KWOK_ANNOTATION: "fake"},
            },
            "spec": {"taints": [BARRIER_TAINT]},
            "status": {
                "capacity": {"cpu": "1", "memory": "1Gi", "pods": "110"},
                "allocatable": {"cpu": "1", "memory": "1Gi", "pods": "110"},
            },
        }

    def _namespace(self, name: str) -> None:
        body = {"metadata": {"name": name, "labels": {RUN_LABEL: self.run}}}
        try:
            self.core.create_namespace(body)
        except ApiException as e:
            if e.status != 409:
                raise
        deadline = time.monotonic() + 60
        while True:
            try:
                self.core.read_namespaced_service_account("default", name)
                return
            except ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def close(self) -> None:
        """Delete everything of the run (nodes, namespaces, inventories) and stop the streams."""
        selector = f"{RUN_LABEL}={self.run}"
        try:
            self._delete_batch(selector, [*self.namespaces.values(), self.barrier_ns])
            for ns in [self.barrier_ns, *self.namespaces.values()]:
                try:
                    self.core.delete_namespace(ns)
                except ApiException as e:
                    if e.status != 404:
                        raise
        finally:
            for s in self.streams:
                s.close()
            self.pool.shutdown()
            self.api.close()
            self.stream_api.close()

    # ------------------------------------------------------------------ writes
    def _create_node(self, body: Json) -> None:
        _read(self.core.create_node(body, _preload_content=False))

    def _create_pod(self, body: Json) -> Json:
        resp = self.core.create_namespaced_pod(
            body["metadata"]["namespace"], body, _preload_content=False
        )
        return dict(json.loads(resp.data))

    def _create_devices(self, body: Json) -> None:
        obj = self.custom.create_cluster_custom_object(*DEVICES, body)
        obj["status"] = body["status"]
        self.custom.replace_cluster_custom_object_status(*DEVICES, body["metadata"]["name"], obj)

    def _map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        return list(self.pool.map(fn, items))

    def _delete_batch(self, selector: str, namespaces: Sequence[str]) -> None:
        def pods(ns: str) -> None:
            try:
                self.core.delete_collection_namespaced_pod(
                    ns, label_selector=selector, grace_period_seconds=0
                )
            except ApiException as e:
                if e.status != 404:
                    raise

        def devices() -> None:
            try:
                self.custom.delete_collection_cluster_custom_object(
                    *DEVICES, label_selector=selector
                )
            except ApiException as e:
                if e.status != 404:
                    raise

        jobs = [self.pool.submit(pods, ns) for ns in namespaces]
        jobs.append(self.pool.submit(self.core.delete_collection_node, label_selector=selector))
        jobs.append(self.pool.submit(devices))
        for j in jobs:
            j.result()

    def _settle(self, taints: dict[str, list[Json]]) -> None:
        """Wait until KWOK reports the nodes Ready, lift the not-ready taint the apiserver put
        on them at creation, and wait until every node is as it will stay.

        kube-controller-manager lifts that taint too, but through a client limited to 20
        requests/s: 10 s for a batch's 80 nodes. Lifting it here is the same write to the same
        state (Ready nodes carry no not-ready taint), and it cannot come back: its controller
        reads the node's conditions from a cache at least as new as the Ready it answers."""

        def seen() -> dict[str, Json]:
            return {n["metadata"]["name"]: n for n in self.nodes.objects.values()}

        def ready() -> dict[str, Json] | None:
            have = seen()
            ok = all(n in have and _ready(have[n]) for n in taints)
            return have if ok else None

        have = _wait(self.changed, f"{len(taints)} nodes Ready", ready, 120)
        lift = [n for n in taints if NOT_READY in _taint_keys(have[n])]
        self._map(
            lambda n: _read(
                self.core.patch_node(
                    n, {"spec": {"taints": taints[n] or None}}, _preload_content=False
                )
            ),
            lift,
        )

        def settled() -> bool:
            have = seen()
            return all(n in have and _node_settled(have[n]) for n in taints)

        _wait(self.changed, f"{len(taints)} nodes settled", settled, 120)

    # ------------------------------------------------------------------ the barrier
    def barrier(self) -> None:
        """Return once both schedulers have seen every node and pod write made before it."""
        token = uuid.uuid4().hex[:10]
        _read(
            self.core.patch_node(
                self.sentinel,
                {"metadata": {"labels": {BARRIER_LABEL: token}}},
                _preload_content=False,
            )
        )
        made = []
        for who, scheduler in ((KUBE, KUBE_SCHEDULER), (OURS, self.ours)):
            body = {
                "metadata": {
                    "name": f"barrier-{token}-{who}",
                    "namespace": self.barrier_ns,
                    "labels": {RUN_LABEL: self.run, BATCH_LABEL: "barrier"},
                },
                "spec": {
                    "schedulerName": scheduler,
                    "nodeSelector": {BARRIER_LABEL: token},
                    "tolerations": [{"key": BARRIER_LABEL, "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            }
            made.append(self._create_pod(body)["metadata"]["uid"])

        def bound() -> bool:
            objs = self.pods.objects
            return all(u in objs and (objs[u]["spec"].get("nodeName")) for u in made)

        _wait(self.changed, f"both schedulers bind barrier {token}", bound, 60)
        for who in (KUBE, OURS):
            self.pool.submit(
                self.core.delete_namespaced_pod,
                f"barrier-{token}-{who}",
                self.barrier_ns,
                grace_period_seconds=0,
            )

    # ------------------------------------------------------------------ verdicts
    def _events_of(self, uid: str) -> list[Json]:
        found = [
            e
            for e in self.events.objects.values()
            if (e.get("involvedObject") or {}).get("uid") == uid
        ]
        return sorted(found, key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")

    def _look(self, o: Observed) -> None:
        """Update ``o`` from what the streams hold now."""
        pod = self.pods.objects.get(o.pod["metadata"]["uid"])
        if pod is None:
            return
        preset = bool(o.pod["spec"].get("nodeName"))
        node = pod["spec"].get("nodeName")
        events = self._events_of(pod["metadata"]["uid"])
        if o.copy.who == OURS and events:
            refusal: Refusal | None = messages.parse_ours(events[0].get("message") or "")
            verdict = GATED if refusal is not None and refusal.gated else REFUSED
            if not preset and node:
                verdict, refusal = BOUND, None
            self._set(o, verdict, node, refusal)
            return
        if preset:
            self._set(o, PRESET, node, None)
            return
        if node:
            self._set(o, BOUND, node, None)
            return
        if o.copy.who == KUBE:
            for c in (pod.get("status") or {}).get("conditions") or ():
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    reason = c.get("reason") or ""
                    if reason in ("Unschedulable", messages.SCHEDULING_GATED):
                        refusal = messages.parse_kube(c.get("message") or "", reason)
                        self._set(o, GATED if refusal.gated else REFUSED, None, refusal)

    @staticmethod
    def _set(o: Observed, verdict: str, node: str | None, refusal: Any) -> None:
        if o.verdict in (REFUSED, GATED) and verdict == BOUND and not o.flipped:
            o.flipped = f"{o.verdict} first, then bound to {node}"
        if o.verdict == UNDECIDED or verdict == BOUND:
            o.verdict, o.node, o.refusal = verdict, node, refusal

    # ------------------------------------------------------------------ one batch
    def run_batch(self, cases: Sequence[Case], deadline_s: float = 60.0) -> list[CaseResult]:
        assert len(cases) <= self.width
        self._batch += 1
        batch = self._batch
        t = time.monotonic()
        copies: list[tuple[Case, list[Copy]]] = []
        for slot, case in enumerate(cases):
            whos = (OURS,) if case.gpu else (KUBE, OURS)
            copies.append(
                (
                    case,
                    [
                        Copy(
                            case,
                            self.run,
                            batch,
                            who,
                            self.namespaces[slot, who],
                            KUBE_SCHEDULER if who == KUBE else self.ours,
                        )
                        for who in whos
                    ],
                )
            )
        every = [c for _, cs in copies for c in cs]
        node_bodies = [node_manifest(c, n) for c in every for n in c.case.nodes]
        self._map(self._create_node, node_bodies)
        devices = [node_devices_manifest(c, n) for c in every for n in c.case.nodes if n.devices]
        self._map(self._create_devices, devices)
        self._map(
            self._create_pod,
            [pod_manifest(c, p, "existing") for c in every for p in c.case.existing],
        )
        names = {b["metadata"]["name"] for b in node_bodies}
        self._settle({b["metadata"]["name"]: b["spec"]["taints"] for b in node_bodies})
        t = self.timings.add("setup", t)
        self.barrier()
        t = self.timings.add("barrier", t)
        snap = self._snapshot()
        probes = [(c, p) for c in every for p in c.case.probes]
        made = self._map(lambda cp: self._create_pod(pod_manifest(cp[0], cp[1], "probe")), probes)
        observed = [Observed(c, pod) for (c, _), pod in zip(probes, made, strict=True)]

        def decided() -> bool:
            for o in observed:
                self._look(o)
            return all(o.verdict != UNDECIDED for o in observed)

        with contextlib.suppress(TimeoutError):  # the undecided ones are findings
            _wait(
                self.changed, f"batch {batch}'s {len(observed)} probes decided", decided, deadline_s
            )
        t = self.timings.add("decide", t)
        self.barrier()
        with self.changed:
            for o in observed:
                self._look(o)
        t = self.timings.add("barrier", t)
        results = self._judge(copies, observed, snap)
        selector = f"{RUN_LABEL}={self.run},{BATCH_LABEL}={batch}"
        self._delete_batch(selector, sorted({c.namespace for c in every}))

        def gone() -> bool:
            pods = (p for p in self.pods.objects.values())
            left_pods = any(p["metadata"]["labels"].get(BATCH_LABEL) == str(batch) for p in pods)
            return not left_pods and not (
                names & {n["metadata"]["name"] for n in self.nodes.objects.values()}
            )

        _wait(self.changed, f"batch {batch} deleted", gone, 120)
        self.timings.add("cleanup", t)
        self.timings.batches += 1
        return results

    def _snapshot(self) -> Snapshot:
        nodes = json.loads(_read(self.core.list_node(_preload_content=False)))["items"]
        return Snapshot(tuple(nodes), tuple(self._final_pods()))

    def _judge(
        self, copies: list[tuple[Case, list[Copy]]], observed: list[Observed], snap: Snapshot
    ) -> list[CaseResult]:
        by_copy: dict[str, list[Observed]] = {}
        for o in observed:
            by_copy.setdefault(o.copy.token, []).append(o)
        out = []
        final: tuple[Snapshot, dict[str, Json]] | None = None
        for case, cs in copies:
            obs = [o for c in cs for o in by_copy.get(c.token, [])]
            if case.gpu:
                if final is None:
                    final = (Snapshot(snap.nodes, tuple(self._final_pods())), self._devices())
                findings = gpu.judge(case, obs, *final)
                out.append(CaseResult(case, obs, findings, final[0]))
            else:
                kube, ours = (next(o for o in obs if o.copy.who == w) for w in (KUBE, OURS))
                out.append(CaseResult(case, obs, judge_pair(case, kube, ours, snap), snap))
        return out

    def _final_pods(self) -> list[Json]:
        resp = self.core.list_pod_for_all_namespaces(_preload_content=False)
        return list(json.loads(_read(resp))["items"])

    def _devices(self) -> dict[str, Json]:
        found = self.custom.list_cluster_custom_object(
            *DEVICES, label_selector=f"{RUN_LABEL}={self.run}"
        )
        return {o["metadata"]["name"]: o for o in found.get("items") or ()}

    def run_cases(
        self, cases: Sequence[Case], on_batch: Callable[[list[CaseResult]], None] | None = None
    ) -> list[CaseResult]:
        out: list[CaseResult] = []
        for start in range(0, len(cases), self.width):
            results = self.run_batch(cases[start : start + self.width])
            if on_batch is not None:
                on_batch(results)
            out += results
        return out
