"""Preemption on the real apiserver with KWOK nodes (issue 35): a high-priority whole-GPU pod
evicts exactly the low-priority pod holding the GPU it gets — not the two shares on the other
GPU, which kube-scheduler's own order evicts when that pod started first — is nominated, and binds
once its victim is gone; a pod whose class says preemptionPolicy Never waits."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

pytestmark = pytest.mark.cluster

CORE, GPU = "aliyun.com/gpu-core", "aliyun.com/gpu"


@pytest.fixture
def priorities(gpu_cluster: Any) -> Iterator[dict[str, str]]:
    """Two PriorityClasses (the admission plugin turns a pod's class into its spec.priority)."""
    api: Any = client.SchedulingV1Api(gpu_cluster.api)  # raw dicts to the typed client
    names = {k: f"sched-{k}-{uuid.uuid4().hex[:6]}" for k in ("low", "high", "polite")}
    for kind, value in (("low", 1), ("high", 1000), ("polite", 1000)):
        body: dict[str, Any] = {"metadata": {"name": names[kind]}, "value": value}
        if kind == "polite":  # the admission plugin copies it onto the pod
            body["preemptionPolicy"] = "Never"
        api.create_priority_class(body)
    try:
        yield names
    finally:
        for name in names.values():
            api.delete_priority_class(name)


class Recorder:
    """Every pod event of the namespace, in the order the watch delivers them (short watches
    resumed from the last resourceVersion, so that stopping closes no stream mid-read)."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.stopping = threading.Event()
        rv = core.list_namespaced_pod(namespace).metadata.resource_version
        self.thread = threading.Thread(
            target=self._run, args=(core, namespace, rv), daemon=True, name="pod-watch"
        )
        self.thread.start()

    def _run(self, core: Any, namespace: str, rv: str) -> None:
        while not self.stopping.is_set():
            w: Any = watch.Watch()  # type: ignore[no-untyped-call]
            for ev in w.stream(
                core.list_namespaced_pod, namespace, resource_version=rv, timeout_seconds=1
            ):
                pod = ev["raw_object"]
                rv = pod["metadata"]["resourceVersion"]
                self.seen.append((ev["type"], pod["metadata"]["name"], pod))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)

    def first(self, name: str, what: Callable[[str, dict[str, Any]], bool]) -> int | None:
        """The index of the first event of ``name`` that ``what(type, pod)`` holds for."""
        for i, (kind, n, pod) in enumerate(self.seen):
            if n == name and what(kind, pod):
                return i
        return None


def _marked(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("reason") == "PreemptionByScheduler"
        for c in pod.get("status", {}).get("conditions") or ()
    )


async def test_a_whole_gpu_pod_preempts_exactly_the_pod_on_the_gpu_it_gets(
    gpu_cluster: Any, scheduler: Callable[..., Any], priorities: dict[str, str]
) -> None:
    (node,) = gpu_cluster.gpu_nodes(1, gpus=2, islands=1)
    scheduler()
    low = {"priorityClassName": priorities["low"], "terminationGracePeriodSeconds": 5}
    c = gpu_cluster.pod("c", {CORE: "60"}, **low)  # the first, and started first: gpu-0
    await gpu_cluster.wait_bound([c])
    shares = [gpu_cluster.pod(n, {CORE: "50"}, **low) for n in ("a", "b")]  # both on gpu-1
    await gpu_cluster.wait_bound(shares)
    gpu_of = {n: gpu_cluster.assignment(n)["containers"][0]["devices"][0]["id"] for n in "cab"}
    assert gpu_of["a"] == gpu_of["b"] != gpu_of["c"], gpu_of
    seen = Recorder(gpu_cluster.core, gpu_cluster.namespace)
    try:
        whole = gpu_cluster.pod("whole", {GPU: "1"}, priorityClassName=priorities["high"])
        bound = await gpu_cluster.wait_bound([whole], deadline_s=90)
    finally:
        seen.stop()
    assert bound == {whole: node}
    assert [d["id"] for d in gpu_cluster.assignment(whole)["containers"][0]["devices"]] == [
        gpu_of["c"]
    ]
    # exactly c went: marked, then deleted; the shares were never touched
    names = {
        p.metadata.name for p in gpu_cluster.core.list_namespaced_pod(gpu_cluster.namespace).items
    }
    assert {"a", "b", "whole"} <= names
    assert "c" not in names
    assert seen.first("a", lambda k, p: k == "DELETED" or _marked(p)) is None
    assert seen.first("b", lambda k, p: k == "DELETED" or _marked(p)) is None
    marked = seen.first("c", lambda k, p: _marked(p))
    gone = seen.first("c", lambda k, p: k == "DELETED")
    nominated = seen.first(whole, lambda k, p: p.get("status", {}).get("nominatedNodeName") == node)
    placed = seen.first(whole, lambda k, p: bool(p["spec"].get("nodeName")))
    assert marked is not None, seen.seen
    assert gone is not None, seen.seen
    assert placed is not None, seen.seen
    assert nominated is not None, seen.seen
    assert marked < gone < placed, "bound only after its victim was gone"
    assert nominated < placed
    uid = gpu_cluster.core.read_namespaced_pod(whole, gpu_cluster.namespace).metadata.uid
    said = f"Preempted: Preempted by pod {uid} on node {node}"
    await gpu_cluster.until("the Preempted Event on c", lambda: said in gpu_cluster.events("c"))


async def test_a_pod_that_may_not_preempt_waits_and_says_why(
    gpu_cluster: Any, scheduler: Callable[..., Any], priorities: dict[str, str]
) -> None:
    gpu_cluster.gpu_nodes(1, gpus=1)
    scheduler()
    holder = gpu_cluster.pod("holder", {GPU: "1"}, priorityClassName=priorities["low"])
    await gpu_cluster.wait_bound([holder])
    polite = gpu_cluster.pod("polite", {GPU: "1"}, priorityClassName=priorities["polite"])
    await gpu_cluster.wait_refused(
        [polite], "preemption: not eligible due to preemptionPolicy=Never."
    )
    assert gpu_cluster.node_of(polite) is None
    assert gpu_cluster.node_of(holder)
