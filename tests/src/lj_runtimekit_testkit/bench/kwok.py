"""Timing pods on a cluster: create them, watch each get a node, delete them.

A phase creates ``n`` pods in a fresh namespace through a :data:`Creator` (16 at a time), records
when each was first seen bound (``spec.nodeName``) from a raw watch, and gives pods/s, the arrival
rate and create → bound latencies; the scheduler benchmarks build their cases from phases. A
phase's setup may put pods of its own in the namespace first (a full cluster to preempt): only
the ``n`` pods it creates are timed, and a :data:`Report` may count what happened to the others.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from lj_runtimekit_testkit.cluster.handle import Cluster

Creator = Callable[[client.ApiClient, str, int], float]
"""Creates the ``i``-th pod of a phase, named ``p-<i>``, in a namespace, and whatever it needs
first; returns :func:`create_pod`'s answer (latencies count from the pod's creation)."""

Step = Callable[[client.ApiClient, str], None]
"""Something done in a phase's namespace: before its pods, or after they are deleted."""

Report = Callable[[client.ApiClient, str, "BoundWatch"], dict[str, float]]
"""Figures of a phase taken once its pods are bound (or its deadline passed), before they are
deleted: given the namespace and the watch (every pod's node as it was seen)."""


class BoundWatch:
    """Records when each pod of a namespace is first seen with a node (raw watch, no models),
    and which node that is."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch_once()
            except Exception as e:  # noqa: BLE001 - a broken watch is opened again
                if self.stop.is_set():
                    return  # the phase is over: the apiserver may be gone already
                print(f"bench: pod watch broke ({e!r}), watching again", file=sys.stderr)
                time.sleep(0.5)

    def _watch_once(self) -> None:
        """One watch (a fresh one lists every pod first, so no binding is missed)."""
        resp = self.core.list_namespaced_pod(
            self.namespace, watch=True, timeout_seconds=30, _preload_content=False
        )
        try:
            buf = b""
            for chunk in resp.stream(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: watch again from a list
                        return
                    obj = event["object"]
                    name = obj.get("metadata", {}).get("name")
                    if not name:  # a BOOKMARK carries no name
                        continue
                    node = (obj.get("spec") or {}).get("nodeName")
                    if node and name not in self.bound:
                        self.bound[name] = now
                        self.nodes[name] = node
                if self.stop.is_set():
                    return
        finally:
            resp.release_conn()


def rss_reset(pid: int) -> None:
    """Start the process's peak RSS (VmHWM) again from its present RSS (Linux ``clear_refs``)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def rss_peak_mib(pid: int) -> float:
    """The process's peak RSS (VmHWM) since it started or since :func:`rss_reset`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def create_pod(api: client.ApiClient, ns: str, body: dict[str, Any]) -> float:
    """Creates the pod; returns when its creation began (``time.monotonic``)."""
    began = time.monotonic()
    core: Any = client.CoreV1Api(api)
    resp = core.create_namespaced_pod(ns, body, _preload_content=False)
    resp.drain_conn()
    resp.release_conn()
    return began


def new_namespace(core: Any) -> str:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    while True:
        try:
            core.read_namespaced_service_account("default", ns)
            return ns
        except client.exceptions.ApiException:
            time.sleep(0.2)


def delete_pods(core: Any, ns: str) -> None:
    for _ in range(10):
        try:
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            break
        except client.exceptions.ApiException as e:
            # 8000 deletions can outlast the apiserver's 60 s request timeout; the deletion
            # goes on server-side, ask again for what is left
            if e.status != 504:
                raise
    while core.list_namespaced_pod(ns, limit=1).items:
        time.sleep(0.5)


def phase(
    cluster: Cluster,
    n: int,
    create_one: Creator,
    deadline_s: float,
    *,
    setup: Step | None = None,
    cleanup: Step | None = None,
    report: Report | None = None,
) -> dict[str, float]:
    """Create ``n`` pods (pod ``i`` named ``p-<i>``) in a fresh namespace; returns pods/s,
    p50/p99 create → bound latency (s), the bound count and ``report``'s figures, then deletes
    every pod of the namespace (``setup``'s too)."""
    with cluster.api_client(pool_size=32) as api:
        core: Any = client.CoreV1Api(api)
        ns = new_namespace(core)
        if setup is not None:
            setup(api, ns)
        watch = BoundWatch(core, ns)
        created: dict[str, float] = {}

        def create(i: int) -> None:
            created[f"p-{i}"] = create_one(api, ns, i)

        start = time.monotonic()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(create, range(n)))
        created_s = time.monotonic() - start
        end = start + deadline_s
        while sum(p in watch.bound for p in created) < n and time.monotonic() < end:
            time.sleep(0.2)
        watch.stop.set()
        timed = [p for p in created if p in watch.bound]
        done = sorted(watch.bound[p] for p in timed)
        lat = sorted(watch.bound[p] - created[p] for p in timed)
        extra = report(api, ns, watch) if report is not None else {}
        delete_pods(core, ns)  # free the pool for the next phase
        if cleanup is not None:
            cleanup(api, ns)
    span = (done[-1] - start) if done else float("inf")
    return {
        "pods_per_s": len(done) / span if done else 0.0,
        # the arrival rate: while binds are held at the client QPS, pods created faster wait
        # longer, so latencies of two phases compare only with their arrival rates alongside
        "created_per_s": n / created_s if n else 0.0,
        "bound": float(len(done)),
        "p50_s": statistics.median(lat) if lat else 0.0,
        "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
        **extra,
    }
