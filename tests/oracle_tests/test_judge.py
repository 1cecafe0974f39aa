"""The judge on hand-made observations: what each kind of disagreement looks like."""

from __future__ import annotations

from typing import Any

from lj_runtimekit_testkit.oracle import checker, messages
from lj_runtimekit_testkit.oracle.cases import (
    KUBE,
    OURS,
    Case,
    Copy,
    NodeSpec,
    PodSpec,
    node_manifest,
    pod_manifest,
)
from lj_runtimekit_testkit.oracle.judge import BOUND, REFUSED, Observed, Snapshot, judge_pair

TAINT = {"key": "dedicated", "value": "a", "effect": "NoSchedule"}
CASE = Case(
    1,
    0,
    ("taints",),
    (NodeSpec("n0", {}, {"cpu": "1", "memory": "1Gi", "pods": "9"}, (TAINT,)),),
    (),
    (PodSpec("probe", {"containers": [{"name": "c"}]}),),
)
UNTOLERATED = (
    "0/2 nodes are available: 2 node(s) had untolerated taint(s). preemption: 0/2 nodes are "
    "available: 2 Preemption is not helpful for scheduling."
)


def _copies() -> tuple[Copy, Copy]:
    k, o = (Copy(CASE, "r", 1, who, f"ns{who}", "s") for who in (KUBE, OURS))
    return k, o


def _snapshot() -> Snapshot:
    nodes = [node_manifest(c, n) for c in _copies() for n in CASE.nodes]
    return Snapshot(tuple(nodes), ())


def _observed(copy: Copy, verdict: str, node: str | None = None, message: str = "") -> Observed:
    pod: dict[str, Any] = pod_manifest(copy, CASE.probes[0], "probe")
    pod["metadata"]["uid"] = copy.who
    parse = messages.parse_kube if copy.who == KUBE else messages.parse_ours
    return Observed(copy, pod, verdict, node, parse(message) if message else None)


def test_agreeing_schedulers_pass() -> None:
    k, o = _copies()
    ours = "0/2 nodes are available: 2 TaintToleration: node(s) had untolerated taint(s)."
    found = judge_pair(
        CASE,
        _observed(k, REFUSED, message=UNTOLERATED),
        _observed(o, REFUSED, message=ours),
        _snapshot(),
    )
    assert found == []


def test_ours_placing_against_a_taint_is_a_verdict_and_a_placement() -> None:
    k, o = _copies()
    found = judge_pair(
        CASE,
        _observed(k, REFUSED, message=UNTOLERATED),
        _observed(o, BOUND, o.node_name("n0")),
        _snapshot(),
    )
    assert [f.what for f in found] == ["verdict", "placement"]
    assert checker.UNTOLERATED in found[1].detail
    assert "--seed 1 --only 0" in found[0].report()


def test_the_same_kinds_in_other_words_are_wording() -> None:
    k, o = _copies()
    old = (
        "0/2 nodes are available: 2 TaintToleration: node(s) had untolerated taint {dedicated: a}."
    )
    found = judge_pair(
        CASE,
        _observed(k, REFUSED, message=UNTOLERATED),
        _observed(o, REFUSED, message=old),
        _snapshot(),
    )
    assert [f.what for f in found] == ["wording"]


def test_other_counts_are_a_reason() -> None:
    k, o = _copies()
    other = (
        "0/2 nodes are available: 2 NodeAffinity: node(s) didn't match Pod's node "
        "affinity/selector."
    )
    found = judge_pair(
        CASE,
        _observed(k, REFUSED, message=UNTOLERATED),
        _observed(o, REFUSED, message=other),
        _snapshot(),
    )
    assert [f.what for f in found] == ["reason"]


def test_a_checker_kube_scheduler_contradicts_is_the_harnesss_own_finding() -> None:
    k, o = _copies()
    ours = "0/2 nodes are available: 2 TaintToleration: node(s) had untolerated taint(s)."

    def blind(pod: Any, nodes: Any, pods: Any) -> checker.Expectation:
        return checker.expect(
            {**pod, "spec": {**pod["spec"], "tolerations": [{"operator": "Exists"}]}}, nodes, pods
        )

    found = judge_pair(
        CASE,
        _observed(k, REFUSED, message=UNTOLERATED),
        _observed(o, REFUSED, message=ours),
        _snapshot(),
        blind,
    )
    assert [f.what for f in found] == ["checker"]


def test_no_decision_is_a_finding() -> None:
    k, o = _copies()
    found = judge_pair(
        CASE, _observed(k, REFUSED, message=UNTOLERATED), _observed(o, "undecided"), _snapshot()
    )
    assert [f.what for f in found] == ["undecided"]
