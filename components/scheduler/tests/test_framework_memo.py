"""The Profile's remembered verdicts: reused only for the same pod shape on an unchanged node."""

from __future__ import annotations

from typing import Any

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import OK, CycleState, Profile, Slot, Status, fail
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins import node_resources_fit
from lj_runtimekit_scheduler.state import ClusterState, NodeInfo

SEEN: Slot[set[str]] = Slot("Counting/seen")
"""Nodes the Counting plugin's Filter saw in this cycle."""


class Counting:
    """A Filter and Score plugin that counts its calls per node."""

    NAME = "Counting"

    def __init__(self) -> None:
        self.filtered: list[str] = []
        self.scored: list[str] = []

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        self.filtered.append(info.node.name)
        cs.setdefault(SEEN, set()).add(info.node.name)
        return OK if info.node.label_map().get("ok") == "yes" else fail("not ok")

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        self.scored.append(info.node.name)
        return int(info.node.name[-1])


def node(name: str, ok: str = "yes") -> Any:
    return objects.node(
        {
            "metadata": {"name": name, "labels": {"ok": ok}},
            "status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def pod(name: str, cpu: str = "1") -> Pod:
    return objects.pod(
        {
            "metadata": {"uid": name, "name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        }
    )


def setup() -> tuple[Profile, Counting, ClusterState]:
    counting = Counting()
    fit = node_resources_fit.NodeResourcesFit(most_allocated=True)
    profile = Profile([(fit, 1), (counting, 1)])
    state = ClusterState()
    for i in range(3):
        state.set_node(node(f"n{i}", "yes" if i else "no"))
    return profile, counting, state


def test_same_shape_on_unchanged_nodes_is_not_evaluated_again() -> None:
    profile, counting, state = setup()
    first = profile.find_node(CycleState(), pod("a"), state)
    assert first.node == "n2"
    assert sorted(counting.filtered) == ["n0", "n1", "n2"]
    assert first.reasons == {"n0": "Counting: not ok"}
    counting.filtered.clear()
    cs = CycleState()
    again = profile.find_node(cs, pod("b"), state)
    # the same verdicts, only the winner evaluated again so its per-cycle state is there
    assert (again.node, again.reasons) == ("n2", {"n0": "Counting: not ok"})
    assert counting.filtered == ["n2"]
    assert cs.read(SEEN) == {"n2"}


def test_a_changed_node_or_another_shape_is_evaluated_again() -> None:
    profile, counting, state = setup()
    profile.find_node(CycleState(), pod("a"), state)
    counting.filtered.clear()
    state.add_pod(pod("held", cpu="4"), "n2")  # n2 is now full
    result = profile.find_node(CycleState(), pod("b"), state)
    assert result.node == "n1"
    assert result.reasons["n2"] == "NodeResourcesFit: Insufficient cpu"
    assert counting.filtered == ["n1"]  # n2 fails on cpu first; n0, n1 remembered; n1 won
    counting.filtered.clear()
    profile.find_node(CycleState(), pod("c", cpu="2"), state)
    assert sorted(counting.filtered) == ["n0", "n1"]  # a new shape: evaluated afresh


def test_a_node_removed_and_added_again_is_not_served_old_verdicts() -> None:
    profile, _, state = setup()
    assert profile.find_node(CycleState(), pod("a"), state).reasons == {"n0": "Counting: not ok"}
    state.remove_node("n0")
    state.set_node(node("n0", "yes"))  # a new NodeInfo, its version starts over at 1
    result = profile.find_node(CycleState(), pod("b"), state)
    assert "n0" not in result.reasons
