"""PodTopologySpread against kube-scheduler's verdicts and scores.

Each case mirrors a case of kube-scheduler's own tests
(``pkg/scheduler/framework/plugins/podtopologyspread/filtering_test.go``: TestSingleConstraint,
TestMultipleConstraints; ``scoring_test.go``: TestPodTopologySpreadScore), named in its comment;
the pods and nodes are written here, the expected verdicts and scores are kube-scheduler's.
"""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_scheduler import objects, terms, workloads
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.labels import Selector
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins import pod_topology_spread as pts
from lj_runtimekit_scheduler.state import ClusterState

MISMATCH, MISSING = pts.MISMATCH, pts.MISSING_LABEL
HOST = "kubernetes.io/hostname"
FOO: dict[str, Any] = {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}
BAR: dict[str, Any] = {"matchExpressions": [{"key": "bar", "operator": "Exists"}]}

_n = iter(range(10**6))


def constraint(
    skew: int, key: str, hard: bool = True, selector: Any = FOO, **extra: Any
) -> dict[str, Any]:
    return {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
        "labelSelector": selector,
        **extra,
    }


def pod(
    labels: dict[str, str] | None = None,
    *spread: dict[str, Any],
    node: str = "",
    ns: str = "default",
    deleting: bool = False,
    **spec: Any,
) -> Pod:
    i = next(_n)
    meta: dict[str, Any] = {"uid": f"u{i}", "name": f"p{i}", "namespace": ns}
    meta["labels"] = {"foo": ""} if labels is None else labels
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    body = {"containers": [], "nodeName": node, "topologySpreadConstraints": list(spread), **spec}
    return objects.pod({"metadata": meta, "spec": body})


def on(node: str, n: int = 1, **kw: Any) -> list[Pod]:
    """``n`` pods labelled foo on ``node``."""
    return [pod(node=node, **kw) for _ in range(n)]


def cluster(
    nodes: dict[str, dict[str, str]], pods: list[Pod], taints: dict[str, Any] | None = None
) -> ClusterState:
    state = ClusterState()
    for name, labels in nodes.items():
        spec = {"taints": [taints[name]]} if taints and name in taints else {}
        state.set_node(objects.node({"metadata": {"name": name, "labels": labels}, "spec": spec}))
    for p in pods:
        state.add_pod(p, p.node_name)
    return state


def verdicts(incoming: Pod, state: ClusterState, args: pts.Args | None = None) -> Any:
    plugin = pts.new(args or pts.Args(), state)
    cs = CycleState()
    if plugin.pre_filter(cs, incoming).skip:
        return "skip"
    out = {}
    for name, info in state.nodes.items():
        st = plugin.filter(cs, incoming, info)
        out[name] = None if st.ok else st.reason
        assert st.unresolvable is (st.reason == MISSING)  # UnschedulableAndUnresolvable
    return out


def zones(*names: str, key: str = "zone") -> dict[str, dict[str, str]]:
    """node-a, node-b in zone1, node-x, node-y in zone2 (or as named)."""
    out = {}
    for n in names or ("node-a", "node-b", "node-x", "node-y"):
        out[n] = {key: "zone1" if n[-1] in "ab" else "zone2", "node": n}
    return out


ZONE1 = constraint(1, "zone")
NODE1 = constraint(1, "node")

SINGLE = [
    # "no existing pods"
    ("no-existing-pods", pod(None, ZONE1), zones(), [], [None] * 4),
    # "no existing pods, incoming pod doesn't match itself"
    (
        "not-matching-itself",
        pod(None, constraint(1, "zone", selector=BAR)),
        zones(),
        [],
        [None] * 4,
    ),
    # "existing pods in a different namespace do not count"
    (
        "other-namespaces-do-not-count",
        pod(None, ZONE1),
        zones(),
        [*on("node-a", ns="ns1"), *on("node-a", ns="ns2"), *on("node-x"), *on("node-y")],
        [None, None, MISMATCH, MISMATCH],
    ),
    # "pods spread across zones as 3/3, all nodes fit"
    (
        "three-three-all-fit",
        pod(None, ZONE1),
        zones(),
        [*on("node-a", 2), *on("node-b"), *on("node-y", 3)],
        [None] * 4,
    ),
    # "pods spread across zones as 1/2 due to absence of label 'zone' on node-b"
    (
        "node-without-the-key",
        pod(None, ZONE1),
        {**zones(), "node-b": {"zon": "zone1", "node": "node-b"}},
        [*on("node-a"), *on("node-b"), *on("node-x"), *on("node-y")],
        [None, MISSING, MISMATCH, MISMATCH],
    ),
    # "pod cannot be scheduled as all nodes don't have label 'rack'"
    (
        "no-node-has-the-key",
        pod(None, constraint(1, "rack")),
        zones("node-a", "node-x"),
        [],
        [MISSING, MISSING],
    ),
    # "pods spread across nodes as 2/1/0/3, only node-x fits"
    (
        "nodes-2-1-0-3",
        pod(None, NODE1),
        zones(),
        [*on("node-a", 2), *on("node-b"), *on("node-y", 3)],
        [MISMATCH, MISMATCH, None, MISMATCH],
    ),
    # "pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit"
    (
        "nodes-2-1-0-3-skew-2",
        pod(None, constraint(2, "node")),
        zones(),
        [*on("node-a", 2), *on("node-b"), *on("node-y", 3)],
        [MISMATCH, None, None, MISMATCH],
    ),
    # "pods spread across nodes as 2/1/0/3, but pod doesn't match itself"
    (
        "nodes-2-1-0-3-not-itself",
        pod({"bar": ""}, NODE1),
        zones(),
        [*on("node-a", 2), *on("node-b"), *on("node-y", 3)],
        [MISMATCH, None, None, MISMATCH],
    ),
    # "terminating Pods should be excluded"
    (
        "terminating-pods-excluded",
        pod(None, NODE1),
        zones("node-a", "node-b"),
        [*on("node-a", deleting=True), *on("node-b")],
        [None, MISMATCH],
    ),
    # minDomains (KEP-3022; "pods spread across zone as 2/1, maxSkew is 2, and the number of
    # domains < minDomains, then the third and fourth pods cannot be scheduled"): with fewer
    # domains than minDomains the global minimum is 0
    (
        "fewer-domains-than-min-domains",
        pod(None, constraint(1, "zone", minDomains=3)),
        zones(),
        [*on("node-a"), *on("node-x")],
        [MISMATCH] * 4,
    ),
    (
        "enough-domains-for-min-domains",
        pod(None, constraint(1, "zone", minDomains=2)),
        zones(),
        [*on("node-a"), *on("node-x")],
        [None] * 4,
    ),
    # "NodeAffinityPolicy honored with nodeAffinity": nodes the pod cannot go to are no domains
    (
        "node-affinity-policy-honor",
        pod(None, ZONE1, nodeSelector={"pool": "p1"}),
        {
            "node-a": {"zone": "zone1", "pool": "p1"},
            "node-x": {"zone": "zone2", "pool": "p1"},
            "node-y": {"zone": "zone2", "pool": "p2"},
        },
        [*on("node-y", 3)],
        [None, None, None],
    ),
    # "NodeAffinityPolicy ignored with nodeAffinity": every node with the key is a domain
    (
        "node-affinity-policy-ignore",
        pod(None, constraint(1, "zone", nodeAffinityPolicy="Ignore"), nodeSelector={"pool": "p1"}),
        {
            "node-a": {"zone": "zone1", "pool": "p1"},
            "node-x": {"zone": "zone2", "pool": "p1"},
            "node-y": {"zone": "zone2", "pool": "p2"},
        },
        [*on("node-y", 3)],
        [None, MISMATCH, MISMATCH],
    ),
    # "NodeTaintsPolicy honored": a node whose taint the pod does not tolerate is no domain
    (
        "node-taints-policy-honor",
        pod(None, constraint(1, "zone", nodeTaintsPolicy="Honor")),
        zones("node-a", "node-x", "node-y"),
        [*on("node-y", 3)],
        [None, None, None],
    ),
    # "NodeTaintsPolicy ignored" (the default)
    (
        "node-taints-policy-ignore",
        pod(None, ZONE1),
        zones("node-a", "node-x", "node-y"),
        [*on("node-y", 3)],
        [None, MISMATCH, MISMATCH],
    ),
    # matchLabelKeys: "the matchLabelKeys is merged into labelSelector": pods of another
    # version do not count
    (
        "match-label-keys",
        pod({"foo": "", "version": "v2"}, constraint(1, "zone", matchLabelKeys=["version"])),
        zones(),
        [pod({"foo": "", "version": "v1"}, node="node-y") for _ in range(3)],
        [None] * 4,
    ),
    (
        "match-label-keys-same-version",
        pod({"foo": "", "version": "v1"}, constraint(1, "zone", matchLabelKeys=["version"])),
        zones(),
        [pod({"foo": "", "version": "v1"}, node="node-y") for _ in range(3)],
        [None, None, MISMATCH, MISMATCH],
    ),
    # an empty labelSelector counts no pod (countPodsMatchSelector) but matches the pod itself
    (
        "empty-selector-counts-nothing",
        pod(None, constraint(1, "zone", selector={})),
        zones(),
        [*on("node-y", 3)],
        [None] * 4,
    ),
    # only ScheduleAnyway constraints: nothing to filter (PreFilter Skip)
    ("soft-only-skips", pod(None, constraint(1, "zone", hard=False)), zones(), [], "skip"),
]


@pytest.mark.parametrize(
    ("incoming", "nodes", "existing", "want"),
    [c[1:] for c in SINGLE],
    ids=[c[0] for c in SINGLE],
)
def test_single_constraint(
    incoming: Pod, nodes: dict[str, dict[str, str]], existing: list[Pod], want: Any
) -> None:
    taints = {"node-y": {"key": "k", "effect": "NoSchedule"}}
    got = verdicts(incoming, cluster(nodes, existing, taints))
    assert got == (want if want == "skip" else dict(zip(nodes, want, strict=True)))


MULTIPLE = [
    # TestMultipleConstraints "two Constraints on zone and node, spreads = [3/3, 2/1/0/3]"
    (
        "zone-3-3-node-2-1-0-3",
        pod(None, ZONE1, NODE1),
        [*on("node-a", 2), *on("node-b"), *on("node-y", 3)],
        [MISMATCH, MISMATCH, None, MISMATCH],
    ),
    # "two Constraints on zone and node, spreads = [3/4, 2/1/0/4]"
    (
        "zone-3-4-node-2-1-0-4",
        pod(None, ZONE1, NODE1),
        [*on("node-a", 2), *on("node-b"), *on("node-y", 4)],
        [MISMATCH, MISMATCH, MISMATCH, MISMATCH],
    ),
    # "Constraints hold different labelSelectors, spreads = [1/0, 1/0/0/1]"
    (
        "different-selectors",
        pod({"foo": "", "bar": ""}, ZONE1, constraint(1, "node", selector=BAR)),
        [*on("node-a"), pod({"bar": ""}, node="node-y")],
        [MISMATCH, MISMATCH, None, MISMATCH],
    ),
]


@pytest.mark.parametrize(
    ("incoming", "existing", "want"), [c[1:] for c in MULTIPLE], ids=[c[0] for c in MULTIPLE]
)
def test_multiple_constraints(incoming: Pod, existing: list[Pod], want: list[str | None]) -> None:
    nodes = zones()
    assert verdicts(incoming, cluster(nodes, existing)) == dict(zip(nodes, want, strict=True))


def test_the_first_broken_constraint_is_the_reason() -> None:
    # Filter checks the constraints in order: node-a lacks the second constraint's key, yet the
    # first one (its zone holds too many) is what it says; only nodes with every key are domains
    nodes = {
        "node-a": {"zone": "zone1"},
        "node-b": {"zone": "zone1", "rack": "r1"},
        "node-x": {"zone": "zone2", "rack": "r2"},
    }
    state = cluster(nodes, on("node-b", 2))
    got = verdicts(pod(None, ZONE1, constraint(1, "rack")), state)
    assert got == {"node-a": MISMATCH, "node-b": MISMATCH, "node-x": None}
    lone = cluster({"node-a": {"zone": "zone1"}, "node-x": {"zone": "zone2"}}, on("node-a", 2))
    # no node has both keys: no domain, nothing to skew against, the missing key is the reason
    got = verdicts(pod(None, ZONE1, constraint(1, "rack")), lone)
    assert got == {"node-a": MISSING, "node-x": MISSING}


def scores(
    incoming: Pod, feasible: dict[str, dict[str, str]], state: ClusterState, args: Any = None
) -> Any:
    plugin = pts.new(args or pts.Args(), state)
    cs = CycleState()
    infos = [state.nodes[n] for n in feasible]
    if plugin.pre_score(cs, incoming, infos).skip:
        return "skip"
    return plugin.normalize({i.node.name: plugin.score(cs, incoming, i) for i in infos})


def hosts(*names: str, zone: bool = False) -> dict[str, dict[str, str]]:
    out = {}
    for n in names:
        out[n] = {HOST: n, **({"zone": "zone1" if n[-1] in "ab" else "zone2"} if zone else {})}
    return out


SOFT_HOST = constraint(1, HOST, hard=False)
SCORING = [
    # "one constraint on node, all 4 nodes are candidates, maxSkew=2" (2/1/0/3)
    (
        "host-2-1-0-3-skew-2",
        pod(None, constraint(2, HOST, hard=False)),
        hosts("node-a", "node-b", "node-c", "node-d"),
        {},
        [*on("node-a", 2), *on("node-b"), *on("node-d", 3)],
        [33, 66, 100, 16],
    ),
    # "one constraint on node, all 4 nodes are candidates, maxSkew=3" (4/3/2/1)
    (
        "host-4-3-2-1-skew-3",
        pod(None, constraint(3, HOST, hard=False)),
        hosts("node-a", "node-b", "node-c", "node-d"),
        {},
        [*on("node-a", 4), *on("node-b", 3), *on("node-c", 2), *on("node-d")],
        [44, 66, 77, 100],
    ),
    # "one constraint on node, 3 out of 4 nodes are candidates" (4/2/1/~3~)
    (
        "host-three-of-four",
        pod(None, SOFT_HOST),
        hosts("node-a", "node-b", "node-x"),
        hosts("node-y"),
        [*on("node-a", 4), *on("node-b", 2), *on("node-x"), *on("node-y", 3)],
        [33, 83, 100],
    ),
    # "one constraint on node, 3 out of 4 nodes are candidates, one node doesn't match topology
    # key"
    (
        "host-one-without-the-key",
        pod(None, SOFT_HOST),
        {**hosts("node-a"), "node-b": {"n": "node-b"}, **hosts("node-x")},
        hosts("node-y"),
        [*on("node-a", 4), *on("node-b", 2), *on("node-x"), *on("node-y", 3)],
        [16, 0, 100],
    ),
    # "one constraint on zone, 3 out of 4 nodes are candidates" (4/2/1/~3~)
    (
        "zone-three-of-four",
        pod(None, constraint(1, "zone", hard=False)),
        hosts("node-a", "node-b", "node-x", zone=True),
        hosts("node-y", zone=True),
        [*on("node-a", 4), *on("node-b", 2), *on("node-x"), *on("node-y", 3)],
        [75, 75, 100],
    ),
    # "two Constraints on zone and node, 2 out of 4 nodes are candidates" (2/~1~/2/~4~)
    (
        "zone-and-host-two-of-four",
        pod(None, constraint(1, "zone", hard=False), SOFT_HOST),
        hosts("node-a", "node-x", zone=True),
        hosts("node-b", "node-y", zone=True),
        [*on("node-a", 2), *on("node-b"), *on("node-x", 2), *on("node-y", 4)],
        [100, 63],
    ),
    # "terminating Pods should be excluded"
    (
        "terminating-excluded",
        pod(None, SOFT_HOST),
        hosts("node-a", "node-b"),
        {},
        [*on("node-a", deleting=True), *on("node-b")],
        [100, 0],
    ),
    # no soft constraint, no default that applies: no score (PreScore Skip)
    ("no-soft-constraint", pod(None, ZONE1), hosts("node-a", "node-b"), {}, [], "skip"),
]


@pytest.mark.parametrize(
    ("incoming", "feasible", "failed", "existing", "want"),
    [c[1:] for c in SCORING],
    ids=[c[0] for c in SCORING],
)
def test_scores(
    incoming: Pod,
    feasible: dict[str, dict[str, str]],
    failed: dict[str, dict[str, str]],
    existing: list[Pod],
    want: Any,
) -> None:
    state = cluster({**feasible, **failed}, existing)
    got = scores(incoming, feasible, state)
    assert got == (want if want == "skip" else dict(zip(feasible, want, strict=True)))


def test_system_defaults_score_a_pod_a_service_selects_even_on_nodes_without_zones() -> None:
    # "system defaulting, nodes don't have zone, pods match service" (4/3/2/1): the same scores
    # as with one hostname constraint of maxSkew 3
    nodes = hosts("node-a", "node-b", "node-c", "node-d")
    existing = [*on("node-a", 4), *on("node-b", 3), *on("node-c", 2), *on("node-d")]
    state = cluster(nodes, existing)
    incoming = pod(None)
    assert scores(incoming, nodes, state) == "skip", "no Service yet: no default constraint"
    state.workloads.put(workloads.SERVICES, "default", "svc", Selector(_foo_in_empty()))
    assert scores(incoming, nodes, state) == dict(zip(nodes, [44, 66, 77, 100], strict=True))
    other = pod({"bar": ""})
    assert scores(other, nodes, state) == "skip", "the Service does not select this pod"


def _foo_in_empty() -> tuple[Any, ...]:
    from lj_runtimekit_scheduler.labels import LabelRequirement

    return (LabelRequirement("foo", "In", ("",)),)


def test_list_defaults_filter_a_pod_of_a_replica_set_with_its_selector() -> None:
    # PodTopologySpreadArgs{defaultingType: List, defaultConstraints: [zone maxSkew 1
    # DoNotSchedule]}: the constraint filters with the selector of the pod's ReplicaSet
    default = terms.constraint(
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}, {}, "d"
    )
    args = pts.Args(pts.LIST, (default,))
    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}]
    raw = {
        "metadata": {
            "uid": "in",
            "name": "in",
            "namespace": "default",
            "labels": {"app": "web"},
            "ownerReferences": owner,
        },
        "spec": {"containers": []},
    }
    incoming = objects.pod(raw)
    web = [pod({"app": "web"}, node="node-x") for _ in range(2)]
    state = cluster(zones(), web)
    assert verdicts(incoming, state, args) == "skip", "the ReplicaSet is not known yet"
    rs = {"metadata": {"name": "rs"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}}
    selector = workloads.selector_of(workloads.REPLICA_SETS, rs)
    state.workloads.put(workloads.REPLICA_SETS, "default", "rs", selector)
    assert verdicts(incoming, state, args) == {
        "node-a": None,
        "node-b": None,
        "node-x": MISMATCH,
        "node-y": MISMATCH,
    }
    # a pod with constraints of its own does not get the defaults
    own = objects.pod(
        {
            **raw,
            "spec": {
                "containers": [],
                "topologySpreadConstraints": [constraint(1, "zone", hard=False)],
            },
        }
    )
    assert verdicts(own, state, args) == "skip"


def test_normalisation_prefers_fewer_matches_and_zeroes_ignored_nodes() -> None:
    assert pts.normalize_spread({"a": 4, "b": 2, "c": pts.IGNORED}) == {"a": 50, "b": 100, "c": 0}
    assert pts.normalize_spread({"a": 0, "b": 0}) == {"a": 100, "b": 100}
