"""Pods bound to a node the apiserver has no Node for: what they hold is kept, never placed onto.

The oracle caught this under load (CI, stop 43): the last status writes of a deleted node's pods
arrived after the node's delete, made it a not-ready placeholder node for good, and every later
refusal counted one node more than kube-scheduler's ("1 NodeReady: node(s) were not ready")."""

from __future__ import annotations

from typing import Any

from lj_runtimekit_scheduler.feed import Informers
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
