"""Preemption's pure decisions: victims on a node (kube-scheduler's reprieve, budgets first,
GPU-aware ways), the order of candidates, PodDisruptionBudgets and the pod fields it reads."""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_scheduler import budgets, objects, preemption
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.preemption import Candidate, Unit, Victims


def pod(name: str, priority: int = 0, started: str = "", **labels: str) -> Pod:
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        priority=priority,
        started=started,
        labels=tuple(sorted(labels.items())),
    )


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


def pdb(name: str, allowed: int, disrupted: tuple[str, ...] = (), **labels: str) -> budgets.Budget:
    return budgets.budget(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"selector": {"matchLabels": labels}},
            "status": {
                "disruptionsAllowed": allowed,
                "disruptedPods": {p: "2026-01-01T00:00:00Z" for p in disrupted},
            },
        }
    )


def sized_fit(sizes: list[int], room: int, need: int) -> preemption.Fits:
    """A node of ``room`` units holding units of ``sizes``; the pod needs ``need``."""

    def fits(off: frozenset[int]) -> bool:
        return sum(s for i, s in enumerate(sizes) if i not in off) + need <= room

    return fits


Spec = tuple[int, int, dict[str, str]]
"""A victim unit: (priority, start second, labels)."""

# (units, their sizes, room, the pod's need, budgets) → the victims' names
CASES: list[tuple[str, list[Spec], list[int], int, int, list[Any], list[str]]] = [
    ("the-lowest-priority-goes", [(1, 0, {}), (2, 0, {}), (3, 0, {})], [1, 1, 1], 3, 1, [], ["u0"]),
    ("of-one-priority-the-last-started", [(1, 0, {}), (1, 5, {})], [1, 1], 2, 1, [], ["u1"]),
    ("only-as-many-as-needed", [(1, 0, {}), (1, 1, {}), (1, 2, {})], [2, 2, 2], 6, 2, [], ["u2"]),
    ("a-bigger-pod-more", [(1, 0, {}), (1, 1, {}), (1, 2, {})], [2, 2, 2], 6, 4, [], ["u1", "u2"]),
    (
        "a-budget-allowing-none-spares-its-pod",
        [(1, 0, {"app": "db"}), (2, 0, {})],
        [1, 1],
        2,
        1,
        [("db", 0, (), "db")],
        ["u1"],
    ),
    (
        "a-budget-allowing-one-does-not-protect",
        [(1, 0, {"app": "db"}), (2, 0, {})],
        [1, 1],
        2,
        1,
        [("db", 1, (), "db")],
        ["u0"],
    ),
    (
        "a-pod-already-disrupted-costs-nothing",
        [(1, 0, {"app": "db"}), (2, 0, {})],
        [1, 1],
        2,
        1,
        [("db", 0, ("u0",), "db")],
        ["u0"],
    ),
    (
        "a-budget-is-broken-when-nothing-else-helps",
        [(1, 0, {"app": "db"})],
        [1],
        1,
        1,
        [("db", 0, (), "db")],
        ["u0"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_victims_on_a_node(
    case: tuple[str, list[Spec], list[int], int, int, list[Any], list[str]],
) -> None:
    _, units, sizes, room, need, budget_args, want = case
    us = [Unit((pod(f"u{i}", p, at(s), **lb),)) for i, (p, s, lb) in enumerate(units)]
    bs = [pdb(name, allowed, disrupted, app=app) for name, allowed, disrupted, app in budget_args]
    got = preemption.select(us, bs, sized_fit(sizes, room, need))
    assert got is not None
    assert [p.name for p in got.pods] == want


def test_no_victims_when_even_all_of_them_gone_is_not_enough() -> None:
    us = [Unit((pod("u0", 1),))]
    assert preemption.select(us, [], sized_fit([1], 1, 2)) is None


def test_the_violations_are_counted_per_unit_breaking_a_budget() -> None:
    us = [Unit((pod("a", 1, app="db"),)), Unit((pod("b", 1, app="db"),))]
    got = preemption.select(us, [pdb("db", 1, app="db")], sized_fit([1, 1], 2, 2))
    assert got is not None
    assert sorted(p.name for p in got.pods) == ["a", "b"]
    assert got.violations == 1


def test_a_gang_is_evicted_whole_and_counted_as_its_members() -> None:
    # g0 is on this node, g1 on another: evicting the gang takes both
    gang = Unit((pod("g0", 1), pod("g1", 1)), frozenset({"g0"}))
    lone = Unit((pod("l", 1),), frozenset({"l"}))
    got = preemption.select([gang, lone], [], sized_fit([1, 1], 2, 1))
    assert got is not None
    assert [p.name for p in got.pods] == ["l"]
    only = preemption.select([gang], [], sized_fit([1], 1, 1))
    assert only is not None
    assert [p.name for p in only.pods] == ["g0", "g1"]
    assert only.rank()[4] == 2  # counted as its members
    assert Victims((lone,)).rank() < only.rank()


def test_gpu_aware_ways_free_the_gpu_of_one_pod_not_the_shares_of_two() -> None:
    # gpu-0: c (started first); gpu-1: a and b (shares). A whole-GPU pod needs one idle GPU.
    c = Unit((pod("c", 1, at(0)),), frozenset({"c"}), frozenset({"gpu-0"}))
    a = Unit((pod("a", 1, at(1)),), frozenset({"a"}), frozenset({"gpu-1"}))
    b = Unit((pod("b", 1, at(2)),), frozenset({"b"}), frozenset({"gpu-1"}))
    units = [c, a, b]

    def idle_gpu(off: frozenset[int]) -> bool:
        held = {d for i, u in enumerate(units) if i not in off for d in u.devices}
        return len(held) < 2

    # kube-scheduler's own order (c most important, given back first) evicts both shares
    plain = preemption.select(units, [], idle_gpu)
    assert plain is not None
    assert [p.name for p in plain.pods] == ["a", "b"]
    # giving back first what is not on gpu-0 evicts c alone: one pod, one GPU
    targeted = preemption.select(units, [], idle_gpu, targets=[frozenset({"gpu-0"})])
    assert targeted is not None
    assert [p.name for p in targeted.pods] == ["c"]
    assert targeted.rank() < plain.rank()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (Victims((Unit((pod("x", 9),)),), 0), Victims((Unit((pod("y", 1),)),), 1)),
        (Victims((Unit((pod("x", 1),)), Unit((pod("y", 1),)))), Victims((Unit((pod("z", 2),)),))),
        (
            Victims((Unit((pod("x", 1),), devices=frozenset({"gpu-0"})),)),
            Victims((Unit((pod("y", 1),), devices=frozenset({"gpu-0", "gpu-1"})),)),
        ),
        (Victims((Unit((pod("x", 1),)),)), Victims((Unit((pod("y", 1),)), Unit((pod("z", 0),))))),
        (Victims((Unit((pod("x", 1),)),)), Victims((Unit((pod("y", 1),)), Unit((pod("z", 1),))))),
        (Victims((Unit((pod("x", 1, at(9)),)),)), Victims((Unit((pod("y", 1, at(1)),)),))),
    ],
    ids=[
        "fewer-budgets-broken-first",
        "lower-highest-priority",
        "fewer-gpus-disturbed",
        "smaller-priority-sum",
        "fewer-victims",
        "latest-start",
    ],
)
def test_candidates_are_ordered_as_kube_scheduler_orders_them(a: Victims, b: Victims) -> None:
    assert a.rank() < b.rank()
    assert preemption.best([Candidate("n2", b), Candidate("n1", a)]) == Candidate("n1", a)


def test_the_candidate_count_is_kube_scheduler_s() -> None:
    assert [preemption.candidates_wanted(n) for n in (5, 100, 1000, 5000)] == [5, 100, 100, 500]


def test_the_dry_run_summary_counts_the_nodes_it_did_not_reach_as_not_helpful() -> None:
    got = preemption.summary({"n1": preemption.NO_VICTIMS}, 3)
    assert got == (
        "0/3 nodes are available: 2 Preemption is not helpful for scheduling, "
        "1 No preemption victims found for incoming pod."
    )


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({"matchLabels": {"app": "db"}}, {"app": "db", "x": "y"}, True),
        ({"matchLabels": {"app": "db"}}, {"app": "web"}, False),
        (
            {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]},
            {"app": "b"},
            True,
        ),
        (
            {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]},
            {"x": "1"},
            True,
        ),
        ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"app": ""}, True),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": "1"}, False),
        ({}, {"app": "db"}, False),
        (None, {"app": "db"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "Near"}]}, {"app": "db"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In"}]}, {"app": "db"}, False),
    ],
    ids=[
        "labels",
        "labels-miss",
        "in",
        "not-in-absent",
        "exists",
        "does-not-exist",
        "empty-matches-nothing",
        "absent-matches-nothing",
        "unknown-operator-matches-nothing",
        "in-without-values-matches-nothing",
    ],
)
def test_budget_selectors_as_kube_scheduler_reads_them(
    selector: Any, labels: dict[str, str], matches: bool
) -> None:
    b = budgets.budget(
        {"metadata": {"name": "b", "namespace": "ns", "uid": "b"}, "spec": {"selector": selector}}
    )
    assert b.matches(Pod("p", "ns", "p", labels=tuple(labels.items()))) is matches
    other_ns = Pod("q", "other", "q", labels=tuple(labels.items()))
    assert not b.matches(other_ns)


def test_the_pod_fields_preemption_reads() -> None:
    raw: dict[str, Any] = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "deletionTimestamp": "x"},
        "spec": {"priority": 7, "preemptionPolicy": "Never", "containers": []},
        "status": {
            "nominatedNodeName": "n1",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
            ],
        },
    }
    p = objects.pod(raw)
    assert (p.priority, p.preemption_policy, p.nominated_node) == (7, "Never", "n1")
    assert p.started == "2026-01-01T00:00:00Z"
    assert p.preempted
    assert p.deleting
    plain = objects.pod({"metadata": {"uid": "v", "name": "q"}, "spec": {"containers": []}})
    assert (plain.preemption_policy, plain.nominated_node, plain.preempted) == (
        "PreemptLowerPriority",
        "",
        False,
    )
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    raw["status"]["conditions"] = [evicted]
    assert not objects.pod(raw).preempted
