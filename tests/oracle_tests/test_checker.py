"""The oracle's checker, table by table: each row is a rule of the Kubernetes API as
kube-scheduler v1.37 applies it (the cluster tests then hold the checker to kube-scheduler's own
verdicts on every generated case)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from lj_runtimekit_testkit.oracle import checker
from lj_runtimekit_testkit.oracle.quantities import parse, round_up

Json = dict[str, Any]


def node(name: str = "n0", labels: Json | None = None, **spec: Any) -> Json:
    alloc = spec.pop("allocatable", {"cpu": "2", "memory": "4Gi", "pods": "110"})
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": alloc},
    }


def pod(uid: str = "p", node_name: str = "", **spec: Any) -> Json:
    spec.setdefault("containers", [{"name": "main"}])
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": uid, "uid": uid}, "spec": spec, "status": {"phase": "Running"}}


def requests(**r: str) -> Json:
    return {"name": "c", "resources": {"requests": r}}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("2", Fraction(2)),
        ("1e3", Fraction(1000)),
        ("1E", Fraction(10**18)),
        ("250u", Fraction(1, 4000)),
        (".5", Fraction(1, 2)),
    ],
    ids=str,
)
def test_quantities_parse_exactly(text: str, value: Fraction) -> None:
    assert parse(text) == value


@pytest.mark.parametrize("text", ["", "1e", "Gi", "1.2.3", "1 Gi", "x"])
def test_a_quantity_that_is_none_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse(text)


def test_rounding_is_up_and_once_per_pod() -> None:
    assert round_up(parse("250u"), milli=True) == 1
    two = pod(containers=[requests(cpu="500u"), requests(cpu="500u")])
    assert checker.pod_requests(two)["cpu"] == 1  # 1m summed exactly, not 1m + 1m


TOLERATIONS = [
    ({"key": "a", "operator": "Exists"}, {"key": "a", "value": "x", "effect": "NoSchedule"}, True),
    ({"key": "a", "value": "x"}, {"key": "a", "value": "x", "effect": "NoSchedule"}, True),
    ({"key": "a", "value": "y"}, {"key": "a", "value": "x", "effect": "NoSchedule"}, False),
    ({"operator": "Exists"}, {"key": "b", "effect": "NoExecute"}, True),
    (
        {"key": "a", "operator": "Exists", "effect": "NoExecute"},
        {"key": "a", "effect": "NoSchedule"},
        False,
    ),
    ({"key": "a", "operator": "Equal"}, {"key": "a", "effect": "NoSchedule"}, True),
    (
        {"key": "a", "operator": "Gt", "value": "1"},
        {"key": "a", "value": "2", "effect": "NoSchedule"},
        False,
    ),
]


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"), TOLERATIONS, ids=[str(i) for i in range(len(TOLERATIONS))]
)
def test_tolerations(toleration: Json, taint: Json, tolerated: bool) -> None:
    assert checker.tolerates(toleration, taint) is tolerated


AFFINITY = [
    ("in", [{"matchExpressions": [{"key": "z", "operator": "In", "values": ["a"]}]}], True),
    (
        "notin-missing",
        [{"matchExpressions": [{"key": "q", "operator": "NotIn", "values": ["a"]}]}],
        True,
    ),
    ("exists", [{"matchExpressions": [{"key": "z", "operator": "Exists"}]}], True),
    ("doesnotexist", [{"matchExpressions": [{"key": "z", "operator": "DoesNotExist"}]}], False),
    ("gt", [{"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["2"]}]}], True),
    ("lt", [{"matchExpressions": [{"key": "tier", "operator": "Lt", "values": ["2"]}]}], False),
    (
        "gt-not-int",
        [{"matchExpressions": [{"key": "z", "operator": "Gt", "values": ["1"]}]}],
        False,
    ),
    ("empty-term", [{}], False),
    ("terms-ored", [{}, {"matchExpressions": [{"key": "z", "operator": "Exists"}]}], True),
    (
        "field-name",
        [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}],
        True,
    ),
    (
        "field-notin",
        [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}]}],
        False,
    ),
]


@pytest.mark.parametrize(
    ("terms", "matches"), [a[1:] for a in AFFINITY], ids=[a[0] for a in AFFINITY]
)
def test_required_node_affinity(terms: list[Json], matches: bool) -> None:
    p = pod(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    )
    assert checker.affinity_matches(p, node(labels={"z": "a", "tier": "3"})) is matches


def test_node_selector_and_affinity_both_hold() -> None:
    p = pod(
        nodeSelector={"z": "a"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "z", "operator": "NotIn", "values": ["a"]}]}
                    ]
                }
            }
        },
    )
    assert not checker.affinity_matches(p, node(labels={"z": "a"}))


def _fields(*terms: list[str]) -> Json:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [n]} for n in names
                        ]
                    }
                    for names in terms
                ]
            }
        }
    }


def test_names_in_every_term_limit_the_nodes_before_any_filter() -> None:
    nodes = [node("n0", unschedulable=True), node("n1"), node("n2", unschedulable=True)]
    e = checker.expect(pod(affinity=_fields(["n1"], ["n9"])), nodes, [])
    assert e.feasible == {"n1"}
    # a cordoned node outside the names is "didn't satisfy", not "unschedulable"
    assert e.reasons == {"n0": (checker.PREFILTERED,), "n2": (checker.PREFILTERED,)}


def test_names_that_exclude_each_other_conflict() -> None:
    e = checker.expect(pod(affinity=_fields(["n0", "n1"])), [node("n0"), node("n1")], [])
    assert e.prefilter == checker.AFFINITY_CONFLICT
    assert not e.feasible


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({"containers": [requests(cpu="1"), requests(cpu="500m")]}, 1500),
        # a regular init container runs alone: the larger of it and the containers
        ({"containers": [requests(cpu="1")], "initContainers": [requests(cpu="3")]}, 3000),
        # a sidecar runs with everything after it: added to the containers
        (
            {
                "containers": [requests(cpu="1")],
                "initContainers": [{**requests(cpu="2"), "restartPolicy": "Always"}],
            },
            3000,
        ),
        # a regular init container *before* a sidecar does not run beside it
        (
            {
                "containers": [requests(cpu="1")],
                "initContainers": [
                    requests(cpu="5"),
                    {**requests(cpu="2"), "restartPolicy": "Always"},
                ],
            },
            5000,
        ),
        # ... and one after it does
        (
            {
                "containers": [requests(cpu="1")],
                "initContainers": [
                    {**requests(cpu="2"), "restartPolicy": "Always"},
                    requests(cpu="5"),
                ],
            },
            7000,
        ),
        # pod-level requests replace the containers' sum for cpu and memory
        ({"containers": [requests(cpu="1")], "resources": {"requests": {"cpu": "3"}}}, 3000),
        ({"containers": [requests(cpu="1")], "overhead": {"cpu": "250m"}}, 1250),
    ],
    ids=[
        "sum",
        "init",
        "sidecar",
        "init-before-sidecar",
        "init-after-sidecar",
        "pod-level",
        "overhead",
    ],
)
def test_pod_requests(spec: Json, want: int) -> None:
    assert checker.pod_requests(pod(**spec))["cpu"] == want


def test_pod_level_requests_leave_other_resources_to_the_containers() -> None:
    p = pod(
        containers=[requests(cpu="1", **{"example.com/w": "2"})],
        resources={"requests": {"memory": "1Gi"}},
    )
    assert checker.pod_requests(p) == {"cpu": 1000, "example.com/w": 2, "memory": 2**30}


def test_resources_name_each_shortfall_and_the_pod_count_first() -> None:
    n = node(allocatable={"cpu": "1", "memory": "1Gi", "pods": "1"})
    held = [pod("e", "n0", containers=[requests(cpu="500m")])]
    want = pod(containers=[requests(cpu="600m", memory="2Gi", **{"example.com/w": "1"})])
    assert checker.node_reasons(want, n, held) == (
        "Too many pods",
        "Insufficient cpu",
        "Insufficient memory",
        "Insufficient example.com/w",
    )


def test_a_pod_asking_nothing_is_checked_for_the_pod_count_only() -> None:
    n = node(allocatable={"cpu": "0", "memory": "0", "pods": "2"})
    over = [pod("e", "n0", containers=[requests(cpu="5")])]
    assert checker.node_reasons(pod(), n, over) == ()


@pytest.mark.parametrize(
    ("want", "used", "conflict"),
    [
        ((("TCP", "0.0.0.0", 80)), ("TCP", "10.0.0.1", 80), True),
        ((("TCP", "10.0.0.1", 80)), ("TCP", "0.0.0.0", 80), True),
        ((("TCP", "10.0.0.1", 80)), ("TCP", "10.0.0.2", 80), False),
        ((("UDP", "0.0.0.0", 80)), ("TCP", "0.0.0.0", 80), False),
        ((("TCP", "127.0.0.1", 80)), ("TCP", "127.0.0.1", 80), True),
    ],
    ids=["any-vs-ip", "ip-vs-any", "two-ips", "two-protocols", "same-ip"],
)
def test_host_ports(want: tuple[str, str, int], used: tuple[str, str, int], conflict: bool) -> None:
    assert checker.ports_conflict([want], [used]) is conflict


def test_a_sidecars_ports_count_and_an_init_containers_do_not() -> None:
    port = {"containerPort": 80, "hostPort": 80}
    p = pod(
        initContainers=[
            {"name": "s", "restartPolicy": "Always", "ports": [port]},
            {"name": "i", "ports": [{"containerPort": 81, "hostPort": 81}]},
        ]
    )
    assert checker.host_ports(p) == [("TCP", "0.0.0.0", 80)]


def test_filters_in_kube_schedulers_order() -> None:
    # cordoned, tainted, unmatched and full at once: the first rule in order is the reason
    n = node(
        labels={},
        unschedulable=True,
        taints=[{"key": "t", "effect": "NoSchedule"}],
        allocatable={"cpu": "0", "memory": "0", "pods": "0"},
    )
    p = pod(nodeSelector={"x": "y"}, containers=[requests(cpu="1")])
    assert checker.node_reasons(p, n, []) == (checker.UNSCHEDULABLE,)
    p["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    assert checker.node_reasons(p, n, []) == (checker.UNTOLERATED,)
    p["spec"]["tolerations"].append({"key": "t", "operator": "Exists"})
    assert checker.node_reasons(p, n, []) == (checker.AFFINITY,)
    p["spec"]["nodeSelector"] = {}
    assert checker.node_reasons(p, n, []) == ("Too many pods", "Insufficient cpu")


def test_prefer_no_schedule_taints_do_not_filter() -> None:
    n = node(taints=[{"key": "t", "effect": "PreferNoSchedule"}])
    assert checker.node_reasons(pod(), n, []) == ()


def test_the_histogram_counts_a_node_under_each_of_its_reasons() -> None:
    nodes = [
        node("a", allocatable={"cpu": "0", "memory": "0", "pods": "9"}),
        node("b", unschedulable=True),
    ]
    e = checker.expect(pod(containers=[requests(cpu="1", memory="1")]), nodes, [])
    assert e.histogram() == {
        "Insufficient cpu": 1,
        "Insufficient memory": 1,
        checker.UNSCHEDULABLE: 1,
    }


def test_a_placement_is_judged_without_the_pod_itself() -> None:
    n = node(allocatable={"cpu": "1", "memory": "1Gi", "pods": "1"})
    me = pod("me", "n0", containers=[requests(cpu="1")])
    assert checker.placement_violations(me, "n0", [n], [me]) == ()
    other = pod("other", "n0")
    assert checker.placement_violations(me, "n0", [n], [me, other]) == ("Too many pods",)


def test_gated_pods_are_not_tried() -> None:
    assert checker.expect(pod(schedulingGates=[{"name": "g"}]), [node()], []).gated
