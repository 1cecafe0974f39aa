"""FailedScheduling messages of both schedulers parsed into counts per reason (fuzz-style for
the parser of outside input: whatever the text, it never raises)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_testkit.oracle import messages

KUBE = (
    "0/12 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 3 node(s) were "
    "unschedulable, 7 node(s) didn't match Pod's node affinity/selector. preemption: 0/12 nodes "
    "are available: 12 Preemption is not helpful for scheduling."
)


def test_kube_schedulers_message_without_what_preemption_adds() -> None:
    r = messages.parse_kube(KUBE)
    assert r.nodes == 12
    assert r.counts == {
        "Insufficient cpu": 1,
        "Insufficient memory": 1,
        "node(s) were unschedulable": 3,
        "node(s) didn't match Pod's node affinity/selector": 7,
    }
    assert r.pod_level is None


def test_a_prefilter_refusal_is_pod_level() -> None:
    r = messages.parse_kube("0/3 nodes are available: pod affinity terms conflict. preemption: x")
    assert (r.nodes, r.pod_level, r.counts) == (3, "pod affinity terms conflict", {})


def test_a_gated_pod() -> None:
    r = messages.parse_kube(
        "Scheduling is blocked due to non-empty scheduling gates", "SchedulingGated"
    )
    assert r.gated


def test_ours_in_kube_schedulers_terms() -> None:
    r = messages.parse_ours(
        "0/12 nodes are available: 7 NodeAffinity: node(s) didn't match Pod's node "
        "affinity/selector, "
        "3 NodeUnschedulable: node(s) were unschedulable, 1 NodeResourcesFit: Insufficient cpu, "
        "Insufficient memory, 1 TaintToleration: node(s) had untolerated taint(s)."
    )
    assert r.nodes == 12
    assert r.counts == {
        "node(s) didn't match Pod's node affinity/selector": 7,
        "node(s) were unschedulable": 3,
        "Insufficient cpu": 1,
        "Insufficient memory": 1,
        "node(s) had untolerated taint(s)": 1,
    }
    assert r.plugins["Insufficient memory"] == "NodeResourcesFit"
    assert messages.kinds(r.counts) == {
        "NodeAffinity": 7,
        "NodeUnschedulable": 3,
        "NodeResourcesFit": 2,
        "TaintToleration": 1,
    }


def test_ours_with_reasons_left_out_and_devices_in_parentheses() -> None:
    r = messages.parse_ours(
        "0/4 nodes are available: 2 GpuFit: no GPU has 60 core free (gpu-0: 30 core, "
        "gpu-1: 0 core), "
        "1 NodePorts: node(s) didn't have free ports for the requested pod ports, "
        "and 1 other reason."
    )
    assert r.counts == {
        "no GPU has 60 core free (gpu-0: 30 core, gpu-1: 0 core)": 2,
        "node(s) didn't have free ports for the requested pod ports": 1,
    }
    assert r.more == 1


def test_ours_pod_level_and_gated() -> None:
    gated = messages.parse_ours(
        "SchedulingGates: waiting for scheduling gates ['example.com/wait']"
    )
    assert gated.gated
    assert gated.pod_level_plugin == "SchedulingGates"
    conflict = messages.parse_ours("NodeAffinity: pod affinity terms conflict")
    assert conflict.pod_level == "pod affinity terms conflict"
    assert not conflict.gated


@given(st.text(max_size=200))
def test_any_text_parses_without_raising(text: str) -> None:
    messages.parse_kube(text)
    messages.parse_ours(text)
    messages.parse_kube("0/3 nodes are available: " + text)
    messages.parse_ours("0/3 nodes are available: " + text)
