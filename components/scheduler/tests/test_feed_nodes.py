"""A watch that expires (410) relists; what was deleted while it was away must leave the state.

And pods bound to a node the apiserver has no Node for: what they hold is kept, never placed
onto. The oracle caught this under load (CI, stop 43): the last status writes of a deleted node's
pods arrived after the node's delete, made it a not-ready placeholder node for good, and every
later refusal counted one node more than kube-scheduler's ("1 NodeReady: node(s) were not
ready")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.kube import Gone
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def devices(name: str) -> dict[str, Any]:
    gpu = {"id": f"{name}-g0", "memoryGiB": 16, "health": "Healthy"}
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": {"devices": [gpu]}}


class Apiserver:
    """Lists what it holds now; a kind's first watch loses ``gone`` from it (a delete the
    watch never delivers) and ends in 410; later watches stay quiet."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]], gone: set[str]) -> None:
        self.objects, self.gone = objects, gone
        self.expired: set[str] = set()
        self.lists: dict[str, int] = {}
        self.relisted: dict[str, asyncio.Event] = {}

    async def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        self.lists[kind] = self.lists.get(kind, 0) + 1
        if self.lists[kind] == 2:
            self.relisted.setdefault(kind, asyncio.Event()).set()
        return list(self.objects.get(kind, [])), "5"

    async def watch(self, kind: str, rv: str) -> AsyncIterator[dict[str, Any]]:
        if kind not in self.expired:
            self.expired.add(kind)
            kept = [o for o in self.objects[kind] if o["metadata"]["name"] not in self.gone]
            self.objects[kind] = kept
            raise Gone(f"watch {kind}: resourceVersion {rv} expired")
        await asyncio.Event().wait()
        yield {}  # pragma: no cover


async def run_until_relisted(inf: Informers, api: Apiserver, kind: str) -> None:
    """Run ``kind``'s informer until its relist is replayed (it then waits in its watch)."""
    task = asyncio.create_task(inf.run(kind))
    await api.relisted.setdefault(kind, asyncio.Event()).wait()
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_node_deleted_while_the_watch_was_away_leaves_the_state_on_relist() -> None:
    both = {"nodes": [node("a"), node("b")], "nodedevices": [devices("a"), devices("b")]}
    api = Apiserver(both, gone={"b"})
    state = ClusterState()
    inf = Informers(api, Settings(), state, SchedulingQueue(1, 10, 60), lambda: None)  # type: ignore[arg-type]

    async def go() -> None:
        # first list: a and b; the watch expires, b deleted meanwhile; the relist lacks b
        await run_until_relisted(inf, api, "nodedevices")
        await run_until_relisted(inf, api, "nodes")

    asyncio.run(go())
    assert set(state.nodes) == {"a"}
    assert state.devices.get("b", ()) == ()
    assert state.nodes["a"].devices


def test_node_devices_naming_their_node_in_spec_are_kept_on_relist() -> None:
    state = ClusterState()
    inf = Informers(None, Settings(), state, SchedulingQueue(1, 10, 60), lambda: None)  # type: ignore[arg-type]
    named = devices("nd-1")
    named["spec"] = {"nodeName": "a"}
    inf._handle("nodes", "ADDED", node("a"))
    inf._handle("nodedevices", "ADDED", named)
    assert state.nodes["a"].devices
    inf._relist("nodedevices", [named, {"metadata": 3}])
    assert state.nodes["a"].devices
    inf._relist("nodedevices", [])
    assert state.nodes["a"].devices == ()


def pod(name: str, on: str, cpu: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "nodeName": on,
            "schedulerName": "default-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Running"},
    }


def feed() -> Informers:
    return Informers(None, Settings(), ClusterState(), SchedulingQueue(1, 10, 60), lambda: None)  # type: ignore[arg-type]


def test_a_pod_seen_after_its_node_was_deleted_leaves_no_node_behind() -> None:
    inf = feed()
    state = inf.state
    inf._handle("nodes", "ADDED", node("a"))
    inf._handle("nodes", "ADDED", node("gone"))
    inf._handle("pods", "ADDED", pod("p", "gone"))
    inf._handle("nodes", "DELETED", node("gone"))
    late = pod("p", "gone")
    late["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    inf._handle("pods", "MODIFIED", late)  # a status write after the Node's delete
    assert set(state.nodes) == {"a"}, "no plugin may place onto, or count, a deleted node"
    inf._handle("pods", "DELETED", late)
    assert set(state.nodes) == {"a"}
    assert state.ghosts == {}, "the last pod gone, nothing of the node is left"


def test_a_pod_seen_before_its_node_holds_its_share_once_the_node_arrives() -> None:
    inf = feed()
    state = inf.state
    inf._handle("pods", "ADDED", pod("early", "b", cpu="3"))
    assert "b" not in state.nodes
    inf._handle("nodes", "ADDED", node("b"))
    assert state.nodes["b"].requested.get("cpu") == 3000
    assert state.nodes["b"].node.ready
    assert state.ghosts == {}


def test_a_node_deleted_and_registered_again_keeps_what_its_running_pods_hold() -> None:
    inf = feed()
    state = inf.state
    inf._handle("nodes", "ADDED", node("c"))
    inf._handle("pods", "ADDED", pod("runs", "c", cpu="3"))
    inf._handle("nodes", "DELETED", node("c"))
    assert "c" not in state.nodes
    inf._handle("nodes", "ADDED", node("c"))  # its kubelet registers it again
    assert state.nodes["c"].requested.get("cpu") == 3000, "a 3-cpu pod still runs there"
    assert state.nodes["c"].pods == {"uid-runs"}


def test_a_relist_without_a_node_keeps_its_pods_counted_until_they_go() -> None:
    inf = feed()
    state = inf.state
    inf._handle("nodes", "ADDED", node("d"))
    inf._handle("pods", "ADDED", pod("x", "d"))
    inf._relist("nodes", [])
    assert "d" not in state.nodes
    assert "d" in state.ghosts
    inf._relist("pods", [])
    assert state.ghosts == {}
