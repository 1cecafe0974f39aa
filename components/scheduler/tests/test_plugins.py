"""Table-driven tests of each plugin's pure core and its Filter verdict."""

from typing import Any

import pytest

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.model import HostPort
from lj_runtimekit_scheduler.plugins import (
    node_affinity,
    node_name,
    node_ports,
    node_ready,
    node_resources_fit,
    node_unschedulable,
    scheduling_gates,
    taint_toleration,
    unsupported_features,
)
from lj_runtimekit_scheduler.state import NodeInfo


def pod(**spec: Any) -> Any:
    spec.setdefault("containers", [{"name": "c", "resources": {"requests": {"cpu": "1"}}}])
    return objects.pod({"metadata": {"uid": "u", "name": "p", "namespace": "ns"}, "spec": spec})


def node(labels: dict[str, str] | None = None, ready: bool = True, **spec: Any) -> Any:
    return objects.node(
        {
            "metadata": {"name": "n1", "labels": labels or {}},
            "spec": spec,
            "status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
    )


NOSCHED = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("pod_spec", "node_spec", "fits"),
    [
        ({}, {}, True),
        ({}, {"taints": [NOSCHED]}, False),
        ({"tolerations": [{"key": "gpu", "operator": "Exists"}]}, {"taints": [NOSCHED]}, True),
        ({"tolerations": [{"key": "gpu", "value": "h100"}]}, {"taints": [NOSCHED]}, False),
        (
            {"tolerations": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]},
            {"taints": [NOSCHED]},
            True,
        ),
        ({"tolerations": [{"operator": "Exists"}]}, {"taints": [NOSCHED]}, True),
        (
            {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]},
            {"taints": [NOSCHED]},
            False,
        ),
        ({}, {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, True),
    ],
    ids=[
        "no-taint",
        "untolerated",
        "exists",
        "wrong-value",
        "equal",
        "wildcard",
        "wrong-effect",
        "prefer-is-soft",
    ],
)
def test_taint_toleration(pod_spec: dict[str, Any], node_spec: dict[str, Any], fits: bool) -> None:
    st = taint_toleration.TaintToleration().filter(
        CycleState(), pod(**pod_spec), NodeInfo(node(**node_spec))
    )
    assert st.ok is fits


def req(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


@pytest.mark.parametrize(
    ("pod_spec", "labels", "fits"),
    [
        ({"nodeSelector": {"zone": "a"}}, {"zone": "a"}, True),
        ({"nodeSelector": {"zone": "a"}}, {"zone": "b"}, False),
        ({"affinity": required([req("zone", "In", "a", "b")])}, {"zone": "b"}, True),
        ({"affinity": required([req("zone", "NotIn", "a")])}, {}, True),
        ({"affinity": required([req("zone", "Exists")])}, {}, False),
        ({"affinity": required([req("zone", "DoesNotExist")])}, {}, True),
        ({"affinity": required([req("gen", "Gt", "3")])}, {"gen": "4"}, True),
        ({"affinity": required([req("gen", "Lt", "3")])}, {"gen": "x"}, False),
        ({"affinity": required([req("a", "Exists")], [req("b", "Exists")])}, {"b": "1"}, True),
        ({"affinity": required([])}, {"b": "1"}, False),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [req("metadata.name", "In", "n1")]}
                            ]
                        }
                    }
                }
            },
            {},
            True,
        ),
    ],
    ids=[
        "selector",
        "selector-miss",
        "in",
        "notin-absent",
        "exists-miss",
        "doesnotexist",
        "gt",
        "lt-not-int",
        "terms-ored",
        "empty-term",
        "match-fields",
    ],
)
def test_node_affinity(pod_spec: dict[str, Any], labels: dict[str, str], fits: bool) -> None:
    assert node_affinity.fits(pod(**pod_spec), node(labels)) is fits


def test_preferred_affinity_scores_matching_weights() -> None:
    aff = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [req("zone", "In", "a")]}},
                {"weight": 3, "preference": {"matchExpressions": [req("fast", "Exists")]}},
            ]
        }
    }
    p = pod(affinity=aff)
    assert node_affinity.preference(p, node({"zone": "a", "fast": "1"})) == 13
    assert node_affinity.preference(p, node({"zone": "b"})) == 0


@pytest.mark.parametrize(
    ("want", "requested", "short"),
    [
        ({"cpu": 1000}, {}, []),
        ({"cpu": 1000}, {"cpu": 3500}, ["cpu"]),
        ({"memory": 2**30, "pods": 1}, {"pods": 110}, ["pods"]),
        ({"aliyun.com/gpu": 1}, {}, ["aliyun.com/gpu"]),
        ({"cpu": 0, "example.com/x": 0}, {}, []),
    ],
    ids=["fits", "cpu-full", "pods-full", "missing-extended", "zero-requests"],
)
def test_resource_fit(want: dict[str, int], requested: dict[str, int], short: list[str]) -> None:
    alloc = {"cpu": 4000, "memory": 8 * 2**30, "pods": 110}
    assert node_resources_fit.insufficient(want, alloc, requested) == short


def test_resource_score_binpack_prefers_fuller() -> None:
    alloc = {"cpu": 4000, "memory": 4000}
    empty = node_resources_fit.allocation_score({"cpu": 1000}, alloc, {}, most=True)
    full = node_resources_fit.allocation_score({"cpu": 1000}, alloc, {"cpu": 2000}, most=True)
    assert full > empty


@pytest.mark.parametrize(
    ("wanted", "used", "conflict"),
    [
        ([HostPort("TCP", "0.0.0.0", 80)], [HostPort("TCP", "10.0.0.1", 80)], True),
        ([HostPort("TCP", "10.0.0.2", 80)], [HostPort("TCP", "10.0.0.1", 80)], False),
        ([HostPort("UDP", "0.0.0.0", 80)], [HostPort("TCP", "0.0.0.0", 80)], False),
        ([HostPort("TCP", "10.0.0.1", 81)], [HostPort("TCP", "10.0.0.1", 80)], False),
        ([HostPort("TCP", "10.0.0.1", 80)], [HostPort("TCP", "10.0.0.1", 80)], True),
    ],
    ids=["any-ip", "other-ip", "other-protocol", "other-port", "same"],
)
def test_host_ports(wanted: list[HostPort], used: list[HostPort], conflict: bool) -> None:
    assert node_ports.conflicts(wanted, used) is conflict


@pytest.mark.parametrize(
    ("check", "pod_spec", "node_obj", "fits"),
    [
        (node_name.NodeName(), {"nodeName": "n1"}, node(), True),
        (node_name.NodeName(), {"nodeName": "n2"}, node(), False),
        (node_unschedulable.NodeUnschedulable(), {}, node(unschedulable=True), False),
        (
            node_unschedulable.NodeUnschedulable(),
            {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
            node(unschedulable=True),
            True,
        ),
        (node_ready.NodeReady(), {}, node(ready=False), False),
        (node_ready.NodeReady(), {}, node(), True),
    ],
    ids=["name-match", "name-other", "cordoned", "cordon-tolerated", "not-ready", "ready"],
)
def test_node_filters(check: Any, pod_spec: dict[str, Any], node_obj: Any, fits: bool) -> None:
    assert check.filter(CycleState(), pod(**pod_spec), NodeInfo(node_obj)).ok is fits


def test_gates_and_unsupported_fail_in_prefilter() -> None:
    gated = pod(schedulingGates=[{"name": "wait"}])
    assert not scheduling_gates.SchedulingGates().pre_filter(CycleState(), gated).ok
    claims = pod(resourceClaims=[{"name": "gpu"}])
    st = unsupported_features.UnsupportedFeatures().pre_filter(CycleState(), claims)
    assert not st.ok
    assert st.unresolvable
    assert "dynamic resource allocation" in st.reason
