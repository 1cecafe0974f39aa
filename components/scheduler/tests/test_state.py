"""ClusterState: the watches run independently, so any arrival order must end in one state."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from lj_runtimekit_scheduler.model import Device, Node, Pod
from lj_runtimekit_scheduler.state import ClusterState

DEVICES = tuple(Device(f"gpu-{i}", "GPU", 80, True, 0, 0, i) for i in range(8))
POD = Pod("uid-1", "ns", "p", node_name="n1", requests={"cpu": 1000})


def steps() -> list[Callable[[ClusterState], None]]:
    return [
        lambda s: s.set_devices("n1", DEVICES),
        lambda s: s.set_node(Node("n1", allocatable={"cpu": 8000})),
        lambda s: s.observe_pod(POD),
    ]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_node_devices_and_pods_in_any_order_give_the_same_node(order: tuple[int, ...]) -> None:
    state = ClusterState()
    for i in order:
        steps()[i](state)
    info = state.nodes["n1"]
    assert info.devices == DEVICES
    assert info.node.allocatable == {"cpu": 8000}
    assert info.requested == {"cpu": 1000}
    assert info.pods == {"uid-1"}


def test_a_gang_s_members_are_indexed_as_they_come_and_go() -> None:
    group = (
        ("lj-runtimekit-scheduler/pod-group", "g"),
        ("lj-runtimekit-scheduler/pod-group-size", "2"),
    )
    a = Pod("a", "ns", "a", annotations=group)
    b = Pod("b", "ns", "b", annotations=group)
    state = ClusterState()
    state.assume(a, "n1", None, float("inf"))
    state.assume(b, "n2", None, float("inf"))
    state.add_pod(Pod("lone", "ns", "lone"), "n1")
    (gid,) = state.gangs
    assert state.gangs[gid] == {"a": "n1", "b": "n2"}
    state.observe_pod(Pod("a", "ns", "a", node_name="n3", annotations=group))  # bound elsewhere
    assert state.gangs[gid] == {"a": "n3", "b": "n2"}
    state.forget("b")
    state.observe_pod(Pod("a", "ns", "a", node_name="n3", phase="Succeeded", annotations=group))
    assert state.gangs == {}
