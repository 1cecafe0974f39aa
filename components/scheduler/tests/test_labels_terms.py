"""Label selectors, inter-pod terms, spread constraints and workload selectors as parsed from
what the apiserver (or anyone) sends: kube-scheduler's reading of each field, a clear error
naming the field for what the apiserver would refuse, and no crash on anything else."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_scheduler import labels, objects, terms, workloads
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.labels import EVERYTHING, NOTHING, LabelRequirement, Selector
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState

FAST = settings(max_examples=80, deadline=1000, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    ("raw", "pod_labels", "matches"),
    [
        (None, {"a": "1"}, False),  # nil: labels.Nothing()
        ({}, {}, True),  # empty: labels.Everything()
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
            {"a": "2"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
            {"a": "1"},
            False,
        ),
    ],
    ids=[
        "nil-nothing",
        "empty-everything",
        "match-labels",
        "match-labels-other-value",
        "in",
        "not-in-absent",
        "exists-empty-value",
        "does-not-exist",
        "requirements-anded",
    ],
)
def test_selector_matching_as_apimachinery(
    raw: Any, pod_labels: dict[str, str], matches: bool
) -> None:
    assert labels.parse(raw, "s").matches(pod_labels) is matches


def test_equal_selectors_are_equal_whatever_the_order() -> None:
    a = labels.parse(
        {"matchLabels": {"x": "1"}, "matchExpressions": [{"key": "y", "operator": "Exists"}]}, "s"
    )
    b = labels.parse(
        {
            "matchExpressions": [
                {"key": "y", "operator": "Exists"},
                {"key": "x", "operator": "In", "values": ["1"]},
            ]
        },
        "s",
    )
    assert a == b
    assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "needs at least one value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "no values"),
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "operator"),
        ({"matchLabels": {"a": 1}}, "expected a string"),
        ("app=web", "label selector object"),
    ],
    ids=["in-without-values", "exists-with-values", "node-operator", "number-value", "text"],
)
def test_a_selector_the_apiserver_refuses_is_an_error_naming_it(raw: Any, where: str) -> None:
    with pytest.raises(ValueError, match=where):
        labels.parse(raw, "spec.x.labelSelector")


def test_affinity_term_namespaces_as_kube_scheduler_reads_them() -> None:
    # getNamespacesFromPodAffinityTerm: neither namespaces nor namespaceSelector → the pod's own
    own = terms.pod_affinity(
        {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {}, "topologyKey": "zone"},
                    {"labelSelector": {}, "topologyKey": "zone", "namespaces": ["a", "b"]},
                    {"labelSelector": {}, "topologyKey": "zone", "namespaceSelector": {}},
                ]
            }
        },
        "mine",
    )
    first, listed, every = own.required
    assert (first.namespaces, first.namespace_selector) == (frozenset({"mine"}), NOTHING)
    assert (listed.namespaces, listed.namespace_selector) == (frozenset({"a", "b"}), NOTHING)
    assert (every.namespaces, every.namespace_selector) == (frozenset(), EVERYTHING)
    assert every.matches("anywhere", {}, None)
    assert not listed.matches("mine", {}, None)


def test_match_label_keys_of_a_spread_constraint_merge_with_the_pod_s_labels() -> None:
    # podtopologyspread/common.go: keys the pod has become key=value requirements; a key the
    # pod lacks is left out; a nil labelSelector stays nil
    base = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
    merged = terms.constraint(
        {**base, "labelSelector": {}, "matchLabelKeys": ["rev", "missing"]}, {"rev": "7"}, "c"
    )
    assert merged.selector == Selector((LabelRequirement("rev", "In", ("7",)),))
    nil = terms.constraint({**base, "matchLabelKeys": ["rev"]}, {"rev": "7"}, "c")
    assert nil.selector == NOTHING
    assert (merged.min_domains, merged.honor_affinity, merged.honor_taints) == (1, True, False)


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"maxSkew": 0}, "maxSkew"),
        ({"topologyKey": ""}, "topologyKey"),
        ({"whenUnsatisfiable": "Sometimes"}, "whenUnsatisfiable"),
        ({"minDomains": 0}, "minDomains"),
        ({"minDomains": 2, "whenUnsatisfiable": "ScheduleAnyway"}, "only with"),
        ({"nodeTaintsPolicy": "Always"}, "nodeTaintsPolicy"),
    ],
    ids=["skew-0", "no-key", "when", "min-domains-0", "min-domains-soft", "policy"],
)
def test_a_spread_constraint_the_apiserver_refuses_is_an_error_naming_it(
    extra: dict[str, Any], where: str
) -> None:
    raw = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", **extra}
    with pytest.raises(ValueError, match=where):
        terms.constraint(raw, {}, "spec.topologySpreadConstraints[0]")


def test_the_controller_is_the_owner_reference_marked_controller() -> None:
    refs = [
        {"apiVersion": "v1", "kind": "Pod", "name": "other"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True},
    ]
    assert terms.controller({"ownerReferences": refs}) == terms.ControllerRef(
        "apps/v1", "ReplicaSet", "rs"
    )
    assert terms.controller({"ownerReferences": "x"}) is None


def test_default_selector_merges_the_services_and_the_controller() -> None:
    # helper.DefaultSelector: every Service of the namespace selecting the pod, plus its
    # ReplicaSet's (or StatefulSet's, ReplicationController's) selector; a nil Service selector
    # selects nothing
    w = workloads.Workloads()
    w.put(workloads.SERVICES, "ns", "web", labels.from_map({"app": "web"}, "s"))
    w.put(workloads.SERVICES, "ns", "other", labels.from_map({"app": "db"}, "s"))
    w.put(workloads.SERVICES, "ns", "headless", None)
    w.put(workloads.SERVICES, "elsewhere", "web", labels.from_map({"tier": "x"}, "s"))
    rs = labels.parse({"matchLabels": {"rev": "1"}}, "s")
    w.put(workloads.REPLICA_SETS, "ns", "web-1", rs)
    raw = {
        "metadata": {
            "uid": "u",
            "name": "p",
            "namespace": "ns",
            "labels": {"app": "web", "rev": "1", "tier": "x"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "controller": True}
            ],
        },
        "spec": {"containers": []},
    }
    got = w.default_selector(objects.pod(raw))
    assert got == Selector(
        (LabelRequirement("app", "In", ("web",)), LabelRequirement("rev", "In", ("1",)))
    )
    w.delete(workloads.SERVICES, "ns", "web")
    w.delete(workloads.REPLICA_SETS, "ns", "web-1")
    assert w.default_selector(objects.pod(raw)).empty


def informers() -> Informers:
    return Informers(
        cast(Any, None), Settings(), ClusterState(), SchedulingQueue(1, 10, 60), lambda: None
    )


def test_the_feed_keeps_namespace_labels_and_workload_selectors() -> None:
    inf = informers()
    assert {"namespaces", *workloads.KINDS} <= set(inf.informers)
    inf._handle("namespaces", "ADDED", {"metadata": {"name": "t1", "labels": {"team": "a"}}})
    inf._handle("namespaces", "ADDED", {"metadata": {"name": "bad", "labels": {"team": 1}}})
    assert inf.state.namespace_labels == {"t1": {"team": "a"}}
    rs = {
        "metadata": {"name": "rs", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"a": "1"}}},
    }
    inf._handle("replicasets", "ADDED", rs)
    inf._handle("replicasets", "ADDED", {"metadata": {"name": "x"}, "spec": {"selector": 5}})
    assert inf.state.workloads.names("replicasets") == {("ns", "rs")}
    inf._handle("namespaces", "DELETED", {"metadata": {"name": "t1"}})
    inf._handle("replicasets", "DELETED", rs)
    assert inf.state.namespace_labels == {}
    assert inf.state.workloads.names("replicasets") == set()
    inf._relist("services", [])
    inf._relist("namespaces", [])


def test_no_workload_informer_when_no_default_constraint_can_apply() -> None:
    cfg = Settings(spread_defaulting="List")
    inf = Informers(cast(Any, None), cfg, ClusterState(), SchedulingQueue(1, 10, 60), lambda: None)
    assert not set(workloads.KINDS) & set(inf.informers)
    assert "namespaces" in inf.informers


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
term_like = st.fixed_dictionaries(
    {},
    optional={
        "labelSelector": json_values,
        "topologyKey": json_values,
        "namespaces": json_values,
        "namespaceSelector": json_values,
        "weight": json_values,
        "podAffinityTerm": json_values,
    },
)


@FAST
@given(
    affinity=st.dictionaries(
        st.sampled_from(["podAffinity", "podAntiAffinity", "nodeAffinity"]),
        st.dictionaries(
            st.sampled_from(
                [
                    "requiredDuringSchedulingIgnoredDuringExecution",
                    "preferredDuringSchedulingIgnoredDuringExecution",
                ]
            ),
            st.lists(term_like | json_values, max_size=3) | json_values,
        )
        | json_values,
    ),
    spread=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "maxSkew": json_values,
                "topologyKey": json_values,
                "whenUnsatisfiable": st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])
                | json_values,
                "labelSelector": json_values,
                "minDomains": json_values,
                "matchLabelKeys": json_values,
                "nodeAffinityPolicy": json_values,
            },
        )
        | json_values,
        max_size=3,
    )
    | json_values,
    owners=json_values,
)
def test_any_affinity_or_spread_is_taken_or_skipped_never_crashes_the_informer(
    affinity: Any, spread: Any, owners: Any
) -> None:
    raw = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "ownerReferences": owners},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler",
            "containers": [],
            "affinity": affinity,
            "topologySpreadConstraints": spread,
        },
    }
    inf = informers()
    inf._handle("pods", "ADDED", raw)
    inf._handle("pods", "ADDED", {**raw, "spec": {**raw["spec"], "nodeName": "n1"}})
    inf._handle("pods", "DELETED", raw)


@FAST
@given(
    kind=st.sampled_from(workloads.KINDS),
    spec=json_values,
    ns_labels=json_values,
)
def test_any_workload_or_namespace_is_taken_or_skipped_never_crashes(
    kind: str, spec: Any, ns_labels: Any
) -> None:
    inf = informers()
    inf._handle(kind, "ADDED", {"metadata": {"name": "w", "namespace": "ns"}, "spec": spec})
    inf._handle("namespaces", "ADDED", {"metadata": {"name": "ns", "labels": ns_labels}})
    inf._handle(kind, "DELETED", {"metadata": {"name": "w", "namespace": "ns"}})
