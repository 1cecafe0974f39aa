"""InterPodAffinity against kube-scheduler's verdicts.

Each case mirrors a case of kube-scheduler's own tests
(``pkg/scheduler/framework/plugins/interpodaffinity/filtering_test.go``:
TestRequiredAffinitySingleNode, TestRequiredAffinityMultipleNodes; ``scoring_test.go``:
TestPreferredAffinity,
TestPreferredAffinityWithHardPodAffinitySymmetricWeight), named in its ``ids`` comment; the
pods and nodes are written here, the expected verdict is kube-scheduler's.
"""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins import inter_pod_affinity as ipa
from lj_runtimekit_scheduler.state import ClusterState

AFF, ANTI, EXISTING = ipa.AFFINITY_MISMATCH, ipa.ANTI_AFFINITY_MISMATCH, ipa.EXISTING_ANTI_AFFINITY
NAMESPACES = {
    "subteam1.team1": {"team": "team1"},
    "subteam2.team1": {"team": "team1"},
    "subteam1.team2": {"team": "team2"},
    "subteam2.team2": {"team": "team2"},
}


def sel(key: str, op: str, *values: str) -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": op}
    if values:
        expr["values"] = list(values)
    return {"matchExpressions": [expr]}


def term(selector: dict[str, Any], topology: str, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": selector, "topologyKey": topology, **extra}


def weighted(weight: int, t: dict[str, Any]) -> dict[str, Any]:
    return {"weight": weight, "podAffinityTerm": t}


_n = iter(range(10**6))


def pod(
    labels: dict[str, str] | None = None,
    *,
    ns: str = "default",
    node: str = "",
    affinity: list[dict[str, Any]] | None = None,
    anti: list[dict[str, Any]] | None = None,
    preferred: list[dict[str, Any]] | None = None,
    preferred_anti: list[dict[str, Any]] | None = None,
) -> Pod:
    i = next(_n)
    spec: dict[str, Any] = {"containers": [], "nodeName": node}
    aff: dict[str, Any] = {}
    if affinity or preferred:
        aff["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": affinity or [],
            "preferredDuringSchedulingIgnoredDuringExecution": preferred or [],
        }
    if anti or preferred_anti:
        aff["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": anti or [],
            "preferredDuringSchedulingIgnoredDuringExecution": preferred_anti or [],
        }
    if aff:
        spec["affinity"] = aff
    meta = {"uid": f"u{i}", "name": f"p{i}", "namespace": ns, "labels": labels or {}}
    return objects.pod({"metadata": meta, "spec": spec})


def cluster(nodes: dict[str, dict[str, str]], pods: list[Pod]) -> ClusterState:
    state = ClusterState()
    state.namespace_labels.update(NAMESPACES)
    for name, labels in nodes.items():
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        state.set_node(
            objects.node({"metadata": {"name": name, "labels": labels}, "status": ready})
        )
    for p in pods:
        state.add_pod(p, p.node_name)
    return state


def verdicts(incoming: Pod, state: ClusterState) -> str | dict[str, str | None]:
    """ "skip" (PreFilter Skip) or node → the failing reason (None: fits), for the nodes of the
    cluster (not the placeholder of a pod's node that does not exist)."""
    plugin = ipa.new(ipa.Args(), state)
    cs = CycleState()
    st = plugin.pre_filter(cs, incoming)
    if st.skip:
        return "skip"
    out: dict[str, str | None] = {}
    for name, info in state.nodes.items():
        if not info.node.ready:
            continue
        f = plugin.filter(cs, incoming, info)
        out[name] = None if f.ok else f.reason
        # kube-scheduler: affinity mismatches are UnschedulableAndUnresolvable, the rest not
        assert f.unresolvable is (f.reason == AFF)
    return out


NODE1 = {"node1": {"region": "r1", "zone": "z11"}}
S1 = {"security": "S1"}
SCAN = {"service": "securityscan"}
EXISTING_SCAN = [pod(SCAN, node="node1")]

SINGLE_NODE = [
    # "A pod that has no required pod affinity scheduling rules can schedule onto a node with no
    # existing pods"
    ("no-rules-skip", pod(), [], "skip"),
    # "satisfies with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using In
    # operator that matches the existing pod"
    (
        "affinity-in",
        pod(S1, affinity=[term(sel("service", "In", "securityscan", "value2"), "region")]),
        EXISTING_SCAN,
        None,
    ),
    # "... using not in operator in labelSelector that matches the existing pod"
    (
        "affinity-not-in",
        pod(S1, affinity=[term(sel("service", "NotIn", "securityscan3", "value3"), "region")]),
        EXISTING_SCAN,
        None,
    ),
    # "Does not satisfy the PodAffinity with labelSelector because of diff Namespace"
    (
        "affinity-other-namespace",
        pod(
            S1,
            affinity=[
                term(sel("service", "In", "securityscan"), "region", namespaces=["DiffNameSpace"])
            ],
        ),
        [pod(SCAN, ns="ns", node="node1")],
        AFF,
    ),
    # "Doesn't satisfy the PodAffinity because of unmatching labelSelector with the existing pod"
    (
        "affinity-selector-unmatched",
        pod(SCAN, affinity=[term(sel("service", "In", "antivirusscan", "value2"), "region")]),
        EXISTING_SCAN,
        AFF,
    ),
    # "satisfies the PodAffinity with different label Operators in multiple
    # RequiredDuringSchedulingIgnoredDuringExecution"
    (
        "affinity-two-terms",
        pod(
            S1,
            affinity=[
                term(
                    {
                        "matchExpressions": [
                            {"key": "service", "operator": "Exists"},
                            {"key": "wrongkey", "operator": "DoesNotExist"},
                        ]
                    },
                    "region",
                ),
                term(
                    {
                        "matchExpressions": [
                            {"key": "service", "operator": "In", "values": ["securityscan"]},
                            {"key": "service", "operator": "NotIn", "values": ["WrongValue"]},
                        ]
                    },
                    "region",
                ),
            ],
        ),
        EXISTING_SCAN,
        None,
    ),
    # "The labelSelector requirements(items of matchExpressions) are ANDed, the pod cannot
    # schedule onto the node because one of the matchExpression item don't match."
    (
        "affinity-requirements-anded",
        pod(
            S1,
            affinity=[
                term(sel("service", "Exists"), "region"),
                term(
                    {
                        "matchExpressions": [
                            {"key": "service", "operator": "In", "values": ["securityscan2"]},
                            {"key": "service", "operator": "NotIn", "values": ["WrongValue"]},
                        ]
                    },
                    "region",
                ),
            ],
        ),
        EXISTING_SCAN,
        AFF,
    ),
    # "satisfies the PodAffinity and PodAntiAffinity with the existing pod"
    (
        "affinity-and-anti",
        pod(
            S1,
            affinity=[term(sel("service", "In", "securityscan", "value2"), "region")],
            anti=[term(sel("service", "In", "antivirusscan", "value2"), "node")],
        ),
        EXISTING_SCAN,
        None,
    ),
    # "satisfies the PodAffinity and PodAntiAffinity and PodAntiAffinity symmetry with the
    # existing pod"
    (
        "symmetry-satisfied",
        pod(
            S1,
            affinity=[term(sel("service", "In", "securityscan", "value2"), "region")],
            anti=[term(sel("service", "In", "antivirusscan", "value2"), "node")],
        ),
        [pod(SCAN, node="node1", anti=[term(sel("service", "In", "antivirusscan"), "node")])],
        None,
    ),
    # "satisfies the PodAffinity but doesn't satisfy the PodAntiAffinity with the existing pod"
    (
        "anti-affinity-broken",
        pod(
            S1,
            affinity=[term(sel("service", "In", "securityscan", "value2"), "region")],
            anti=[term(sel("service", "In", "securityscan", "value2"), "zone")],
        ),
        EXISTING_SCAN,
        ANTI,
    ),
    # "satisfies the PodAffinity and PodAntiAffinity but doesn't satisfy PodAntiAffinity symmetry
    # with the existing pod"
    (
        "symmetry-broken",
        pod(
            SCAN,
            affinity=[term(sel("service", "In", "securityscan", "value2"), "region")],
            anti=[term(sel("service", "In", "antivirusscan", "value2"), "node")],
        ),
        [pod(SCAN, node="node1", anti=[term(sel("service", "In", "securityscan"), "zone")])],
        EXISTING,
    ),
    # "pod matches its own Label in PodAffinity and that matches the existing pod Labels"
    # (the existing pod is on a node not in the cluster: it counts nowhere)
    (
        "no-match-anywhere",
        pod(SCAN, affinity=[term(sel("service", "NotIn", "securityscan", "value2"), "region")]),
        [pod(SCAN, node="node2")],
        AFF,
    ),
    # "verify that PodAntiAffinity from existing pod is respected when pod has no AntiAffinity
    # constraints. doesn't satisfy PodAntiAffinity symmetry with the existing pod"
    (
        "existing-anti-repels",
        pod(SCAN),
        [pod(SCAN, node="node1", anti=[term(sel("service", "In", "securityscan"), "zone")])],
        EXISTING,
    ),
    # "... satisfy PodAntiAffinity symmetry with the existing pod" (PreFilter Skip)
    (
        "existing-anti-not-matching-skips",
        pod(SCAN),
        [pod(SCAN, node="node1", anti=[term(sel("service", "NotIn", "securityscan"), "zone")])],
        "skip",
    ),
    # "satisfies the PodAntiAffinity with existing pod but doesn't satisfy PodAntiAffinity
    # symmetry with incoming pod"
    (
        "anti-both-ways",
        pod(
            SCAN,
            anti=[
                term(sel("service", "Exists"), "region"),
                term(sel("security", "Exists"), "region"),
            ],
        ),
        [pod(S1, node="node1", anti=[term(sel("security", "Exists"), "zone")])],
        ANTI,
    ),
    # "PodAntiAffinity symmetry check a1: incoming pod and existing pod partially match each other
    # on AffinityTerms"
    (
        "symmetry-a1",
        pod(
            SCAN,
            anti=[term(sel("service", "Exists"), "zone"), term(sel("security", "Exists"), "zone")],
        ),
        [pod(S1, node="node1", anti=[term(sel("security", "Exists"), "zone")])],
        ANTI,
    ),
    # "PodAntiAffinity symmetry check a2"
    (
        "symmetry-a2",
        pod(S1, anti=[term(sel("security", "Exists"), "zone")]),
        [
            pod(
                SCAN,
                node="node1",
                anti=[
                    term(sel("service", "Exists"), "zone"),
                    term(sel("security", "Exists"), "zone"),
                ],
            )
        ],
        EXISTING,
    ),
    # "PodAntiAffinity symmetry check b1"
    (
        "symmetry-b1",
        pod(
            {"abc": "", "xyz": ""},
            anti=[term(sel("abc", "Exists"), "zone"), term(sel("def", "Exists"), "zone")],
        ),
        [
            pod(
                {"def": "", "xyz": ""},
                node="node1",
                anti=[term(sel("abc", "Exists"), "zone"), term(sel("def", "Exists"), "zone")],
            )
        ],
        ANTI,
    ),
    # "affinity with NamespaceSelector"
    (
        "namespace-selector",
        pod(
            S1,
            affinity=[
                term(
                    sel("service", "In", "securityscan", "value2"),
                    "region",
                    namespaceSelector=sel("team", "In", "team1"),
                )
            ],
        ),
        [pod(SCAN, ns="subteam1.team1", node="node1")],
        None,
    ),
    # "affinity with non-matching NamespaceSelector"
    (
        "namespace-selector-unmatched",
        pod(
            S1,
            affinity=[
                term(
                    sel("service", "In", "securityscan", "value2"),
                    "region",
                    namespaceSelector=sel("team", "In", "team1"),
                )
            ],
        ),
        [pod(SCAN, ns="subteam1.team2", node="node1")],
        AFF,
    ),
    # "anti-affinity with matching NamespaceSelector"
    (
        "anti-namespace-selector",
        pod(
            S1,
            ns="subteam1.team1",
            anti=[
                term(
                    sel("service", "In", "securityscan", "value2"),
                    "zone",
                    namespaceSelector=sel("team", "In", "team1"),
                )
            ],
        ),
        [pod(SCAN, ns="subteam2.team1", node="node1")],
        ANTI,
    ),
    # "anti-affinity with matching all NamespaceSelector"
    (
        "anti-every-namespace",
        pod(
            S1,
            ns="subteam1.team1",
            anti=[term(sel("service", "In", "securityscan"), "zone", namespaceSelector={})],
        ),
        [pod(SCAN, ns="subteam2.team1", node="node1")],
        ANTI,
    ),
    # "anti-affinity with non-matching NamespaceSelector"
    (
        "anti-namespace-selector-unmatched",
        pod(
            S1,
            ns="subteam1.team1",
            anti=[
                term(
                    sel("service", "In", "securityscan"),
                    "zone",
                    namespaceSelector=sel("team", "In", "team1"),
                )
            ],
        ),
        [pod(SCAN, ns="subteam1.team2", node="node1")],
        None,
    ),
    # an existing pod's term with a namespaceSelector is matched against the incoming pod's
    # namespace labels (AffinityTerm.Matches with the incoming pod's nsLabels)
    (
        "existing-anti-namespace-selector",
        pod(SCAN, ns="subteam1.team1"),
        [
            pod(
                S1,
                ns="subteam1.team2",
                node="node1",
                anti=[
                    term(
                        sel("service", "Exists"),
                        "zone",
                        namespaceSelector=sel("team", "In", "team1"),
                    )
                ],
            )
        ],
        EXISTING,
    ),
]


@pytest.mark.parametrize(
    ("incoming", "existing", "want"),
    [c[1:] for c in SINGLE_NODE],
    ids=[c[0] for c in SINGLE_NODE],
)
def test_required_affinity_single_node(incoming: Pod, existing: list[Pod], want: Any) -> None:
    got = verdicts(incoming, cluster(NODE1, existing))
    assert got == (want if want == "skip" else {"node1": want})


CHINA, CHINA_AZ1, INDIA = {"region": "China"}, {"region": "China", "az": "az1"}, {"region": "India"}
THREE = {"node1": CHINA, "node2": CHINA_AZ1, "node3": INDIA}
AB_ZONES = {
    "nodeA": {"region": "r1", "zone": "z1", "hostname": "nodeA"},
    "nodeB": {"region": "r1", "zone": "z2", "hostname": "nodeB"},
}

MULTIPLE_NODES = [
    # "A pod can be scheduled onto all the nodes that have the same topology key & label value
    # with one of them has an existing pod that matches the affinity rules"
    (
        "same-domain-as-match",
        pod(affinity=[term(sel("foo", "In", "bar"), "region")]),
        THREE,
        [pod({"foo": "bar"}, node="node1")],
        [None, None, AFF],
    ),
    # "The affinity rule is to schedule all of the pods of this collection to the same zone. The
    # first pod of the collection should not be blocked from being scheduled onto any node, even
    # there's no existing pod that matches the rule anywhere."
    (
        "first-of-a-collection",
        pod(
            {"foo": "bar", "service": "securityscan"},
            affinity=[
                term(sel("foo", "In", "bar"), "zone"),
                term(sel("service", "In", "securityscan"), "zone"),
            ],
        ),
        {"nodeA": {"zone": "az1", "hostname": "h1"}, "nodeB": {"zone": "az2", "hostname": "h2"}},
        [pod({"foo": "bar"}, node="nodeA")],
        [None, None],
    ),
    # "The first pod of the collection can only be scheduled on nodes labelled with the requested
    # topology keys"
    (
        "first-needs-topology-keys",
        pod(
            {"foo": "bar", "service": "securityscan"},
            affinity=[
                term(sel("foo", "In", "bar"), "zone"),
                term(sel("service", "In", "securityscan"), "zone"),
            ],
        ),
        {"nodeA": {"zoneLabel": "az1"}, "nodeB": {"zoneLabel": "az2"}},
        [pod({"foo": "bar"}, node="nodeA")],
        [AFF, AFF],
    ),
    # "NodeA and nodeB have same topologyKey and label value. NodeA has an existing pod that
    # matches the inter pod affinity rule. The pod can not be scheduled onto nodeA and nodeB."
    (
        "anti-same-domain",
        pod(anti=[term(sel("foo", "In", "abc"), "region")]),
        {"nodeA": {"region": "r1"}, "nodeB": {"region": "r1"}},
        [pod({"foo": "abc"}, node="nodeA")],
        [ANTI, ANTI],
    ),
    # "This test ensures that anti-affinity matches a pod when any term of the anti-affinity rule
    # matches a pod."
    (
        "anti-any-term",
        pod(
            anti=[
                term(sel("foo", "In", "abc"), "region"),
                term(sel("service", "In", "securityscan"), "zone"),
            ]
        ),
        {"nodeA": {"region": "r1", "zone": "z1"}, "nodeB": {"region": "r1", "zone": "z2"}},
        [pod({"foo": "abc", "service": "securityscan"}, node="nodeA")],
        [ANTI, ANTI],
    ),
    # "... The pod can not be scheduled onto nodeA and nodeB but can be scheduled onto nodeC"
    (
        "anti-other-region-fits",
        pod(anti=[term(sel("foo", "In", "abc"), "region")]),
        THREE,
        [pod({"foo": "abc"}, node="node1")],
        [ANTI, ANTI, None],
    ),
    # "... (NodeC has an existing pod that match the inter pod affinity rule but in different
    # namespace)"
    (
        "anti-term-of-another-namespace",
        pod({"foo": "123"}, ns="NS1", anti=[term(sel("foo", "In", "bar"), "region")]),
        THREE,
        [
            pod({"foo": "bar"}, ns="NS1", node="node1"),
            pod(ns="NS2", node="node3", anti=[term(sel("foo", "In", "123"), "region")]),
        ],
        [ANTI, ANTI, None],
    ),
    # "Test existing pod's anti-affinity: if an existing pod has a term with invalid topologyKey,
    # labelSelector of the term is firstly checked, and then topologyKey of the term is also
    # checked" (PreFilter Skip)
    (
        "existing-term-key-on-no-node",
        pod({"foo": ""}),
        AB_ZONES,
        [pod(node="nodeA", anti=[term(sel("foo", "Exists"), "invalid-node-label")])],
        "skip",
    ),
    # "Test incoming pod's anti-affinity: even if labelSelector matches, we still check if
    # topologyKey matches"
    (
        "incoming-term-key-on-no-node",
        pod(anti=[term(sel("foo", "Exists"), "invalid-node-label")]),
        AB_ZONES,
        [pod({"foo": ""}, node="nodeA")],
        [None, None],
    ),
    # "Test existing pods' anti-affinity: incoming pod wouldn't considered as a fit as it violates
    # each existingPod's terms on all nodes"
    (
        "existing-terms-on-every-node",
        pod({"foo": "", "bar": ""}),
        AB_ZONES,
        [
            pod(node="nodeA", anti=[term(sel("foo", "Exists"), "zone")]),
            pod(node="nodeA", anti=[term(sel("bar", "Exists"), "region")]),
        ],
        [EXISTING, EXISTING],
    ),
]


@pytest.mark.parametrize(
    ("incoming", "nodes", "existing", "want"),
    [c[1:] for c in MULTIPLE_NODES],
    ids=[c[0] for c in MULTIPLE_NODES],
)
def test_required_affinity_multiple_nodes(
    incoming: Pod, nodes: dict[str, dict[str, str]], existing: list[Pod], want: Any
) -> None:
    got = verdicts(incoming, cluster(nodes, existing))
    assert got == (want if want == "skip" else dict(zip(nodes, want, strict=True)))


def scores(incoming: Pod, state: ClusterState, args: ipa.Args | None = None) -> Any:
    """ "skip" or node → normalised score, over every node as feasible."""
    plugin = ipa.new(args or ipa.Args(), state)
    cs = CycleState()
    infos = list(state.nodes.values())
    if plugin.pre_score(cs, incoming, infos).skip:
        return "skip"
    return plugin.normalize({i.node.name: plugin.score(cs, incoming, i) for i in infos})


STAY_S1 = [weighted(5, term(sel("security", "In", "S1"), "region"))]
STAY_S2 = [weighted(6, term(sel("security", "In", "S2"), "region"))]
AWAY_S1_AZ = [weighted(5, term(sel("security", "In", "S1"), "az"))]
HARD = [
    term(sel("security", "In", "S1", "value2"), "region"),
    term(
        {
            "matchExpressions": [
                {"key": "security", "operator": "Exists"},
                {"key": "wrongkey", "operator": "DoesNotExist"},
            ]
        },
        "region",
    ),
]
S2 = {"security": "S2"}

PREFERRED = [
    # "all nodes are same priority as Affinity is nil"
    (
        "no-terms-skip",
        pod(S1),
        {"node1": CHINA, "node2": INDIA, "node3": {"az": "az1"}},
        [],
        "skip",
    ),
    # "Affinity: pod that matches topology key & pods in nodes will get high score comparing to
    # others which doesn't match either pods in nodes or in topology key"
    (
        "matching-domain-wins",
        pod(S1, preferred=STAY_S1),
        {"node1": CHINA, "node2": INDIA, "node3": {"az": "az1"}},
        [pod(S1, node="node1"), pod(S2, node="node2"), pod(S1, node="node3")],
        [100, 0, 0],
    ),
    # "All the nodes that have the same topology key & label value with one of them has an
    # existing pod that match the affinity rules, have the same score"
    (
        "same-domain-same-score",
        pod(preferred=STAY_S1),
        THREE,
        [pod(S1, node="node1")],
        [100, 100, 0],
    ),
    # "Affinity: nodes in one region has more matching pods comparing to other region, so the
    # region which has more matches will get high score"
    (
        "more-matches-higher",
        pod(S1, preferred=STAY_S2),
        {"node1": CHINA, "node2": INDIA, "node3": CHINA, "node4": CHINA, "node5": INDIA},
        [pod(S2, node=n) for n in ("node1", "node1", "node2", "node3", "node4", "node5")],
        [100, 0, 100, 100, 0],
    ),
    # "Anti Affinity: pod that does not match existing pods in node will get high score"
    (
        "preferred-anti",
        pod(S1, preferred_anti=AWAY_S1_AZ),
        {"node1": {"az": "az1"}, "node2": {"az": "az2"}},
        [pod(S1, node="node1")],
        [0, 100],
    ),
    # TestPreferredAffinityWithHardPodAffinitySymmetricWeight: "Hard Pod Affinity symmetry: hard
    # pod affinity symmetry weights 1 by default, then nodes that match the hard pod affinity
    # symmetry rules, get a high score"
    (
        "hard-affinity-symmetry",
        pod(S1),
        {"node1": CHINA, "node2": INDIA},
        [pod(S2, node="node1", affinity=HARD)],
        [100, 0],
    ),
    # existing pods' preferred anti-affinity repels the incoming pod (processExistingPod)
    (
        "existing-preferred-anti",
        pod(S1),
        {"node1": {"az": "az1"}, "node2": {"az": "az2"}},
        [pod(S2, node="node1", preferred_anti=AWAY_S1_AZ)],
        [0, 100],
    ),
    # "Affinity: nodes in one region has more matching pods comparing to other region" with a
    # namespaceSelector: the term selects namespaces by list and by label
    (
        "preferred-namespace-selector",
        pod(
            preferred=[
                weighted(
                    5,
                    term(
                        sel("security", "In", "S1"),
                        "region",
                        namespaces=["subteam2.team2"],
                        namespaceSelector=sel("team", "In", "team1"),
                    ),
                )
            ],
        ),
        {"node1": CHINA, "node2": INDIA, "node3": {"region": "Japan"}},
        [
            pod(S1, ns="subteam1.team1", node="node1"),
            pod(S1, ns="subteam2.team2", node="node2"),
            pod(S1, ns="subteam1.team2", node="node3"),
        ],
        [100, 100, 0],
    ),
]


@pytest.mark.parametrize(
    ("incoming", "nodes", "existing", "want"),
    [c[1:] for c in PREFERRED],
    ids=[c[0] for c in PREFERRED],
)
def test_preferred_affinity_scores(
    incoming: Pod, nodes: dict[str, dict[str, str]], existing: list[Pod], want: Any
) -> None:
    got = scores(incoming, cluster(nodes, existing))
    assert got == (want if want == "skip" else dict(zip(nodes, want, strict=True)))


def test_hard_pod_affinity_weight_zero_and_ignoring_existing_preferred_terms_skip() -> None:
    # TestPreferredAffinityWithHardPodAffinitySymmetricWeight "... weights 0": no score at all;
    # IgnorePreferredTermsOfExistingPods: an incoming pod without preferred terms is not scored
    state = cluster({"node1": CHINA, "node2": INDIA}, [pod(S2, node="node1", affinity=HARD)])
    assert scores(pod(S1), state, ipa.Args(hard_pod_affinity_weight=0)) == "skip"
    state = cluster(
        {"node1": {"az": "az1"}, "node2": {"az": "az2"}},
        [pod(S2, node="node1", preferred_anti=AWAY_S1_AZ)],
    )
    ignoring = ipa.Args(ignore_preferred_terms_of_existing_pods=True)
    assert scores(pod(S1), state, ignoring) == "skip"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"a": -5, "b": 0, "c": 5}, {"a": 0, "b": 50, "c": 100}),
        ({"a": 3, "b": 3}, {"a": 0, "b": 0}),
        ({"a": 1, "b": 2, "c": 4}, {"a": 0, "b": 33, "c": 100}),
        ({}, {}),
    ],
    ids=["negative-to-positive", "all-equal", "truncated", "empty"],
)
def test_normalisation_is_min_max_truncated(raw: dict[str, int], want: dict[str, int]) -> None:
    # NormalizeScore: 100 × (score − min) / (max − min), int64 of the float
    assert ipa.normalize_min_max(raw) == want
