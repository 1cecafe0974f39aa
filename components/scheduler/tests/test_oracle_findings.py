"""Disagreements with kube-scheduler (v1.37) that the differential harness found (issue 35 §2,
``tests/oracle_tests``: the same generated cases under both schedulers on one apiserver), each
pinned here on the default profile so it cannot come back. The FailedScheduling words and counts
are kube-scheduler's, taken from its own messages in those runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import CycleState, Result
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.scheduler import summary
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState

Json = dict[str, Any]


def node(name: str, labels: Json | None = None, **spec: Any) -> Json:
    alloc = spec.pop("allocatable", {"cpu": "4", "memory": "8Gi", "pods": "110"})
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(name: str = "p", node_name: str = "", **spec: Any) -> Json:
    spec.setdefault("containers", [{"name": "c"}])
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"uid": name, "name": name, "namespace": "ns"},
        "spec": {"schedulerName": "lj-runtimekit-scheduler", **spec},
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def cpu(amount: str) -> Json:
    return {"name": "c", "resources": {"requests": {"cpu": amount}}}


def schedule(want: Json, nodes: list[Json], bound: Sequence[Json] = ()) -> tuple[Result, str]:
    state = ClusterState()
    for n in nodes:
        state.set_node(objects.node(n))
    for b in bound:
        state.observe_pod(objects.pod(b))
    profile = build_profile(Settings(), state, Metrics())
    result = profile.find_node(CycleState(), objects.pod(want), state)
    return result, summary(result, len(state.nodes))


def test_a_node_tainted_and_unmatched_counts_as_untolerated_as_kube_scheduler_counts_it() -> None:
    # kube-scheduler filters TaintToleration before NodeAffinity; ours had them the other way,
    # so every tainted node that also missed the selector was counted under NodeAffinity
    nodes = [node("n1", taints=[{"key": "t", "effect": "NoSchedule"}]), node("n2")]
    result, _ = schedule(pod(nodeSelector={"zone": "a"}), nodes)
    assert result.reasons == {
        "n1": "TaintToleration: node(s) had untolerated taint(s)",
        "n2": "NodeAffinity: node(s) didn't match Pod's node affinity/selector",
    }


def test_an_untolerated_taint_is_worded_as_kube_scheduler_words_it() -> None:
    # v1.37 names no taint ("node(s) had untolerated taint {t: v}" before)
    _, text = schedule(
        pod(), [node("n1", taints=[{"key": "t", "value": "v", "effect": "NoExecute"}])]
    )
    # and kube-scheduler's preemption part: no eviction removes a taint (unresolvable)
    assert text == (
        "0/1 nodes are available: 1 TaintToleration: node(s) had untolerated taint(s)."
        " preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    )


def test_a_node_with_no_pod_slot_left_is_too_many_pods() -> None:
    full = node("n1", allocatable={"cpu": "1", "memory": "1Gi", "pods": "1"})
    _, text = schedule(pod(containers=[cpu("2")]), [full], [pod("e", "n1")])
    # the pod count first, then cpu, as kube-scheduler lists them ("Insufficient pods" before)
    assert text == (
        "0/1 nodes are available: 1 NodeResourcesFit: Too many pods, Insufficient cpu."
        " preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    )


def test_a_regular_init_container_before_a_sidecar_does_not_run_beside_it() -> None:
    # containers 1 + sidecar 2 = 3; the init container (5) runs before the sidecar starts: 5,
    # not 5 + 2 (ours counted 7 and refused a node with 6 cpu)
    spec: Json = {
        "containers": [cpu("1")],
        "initContainers": [
            {**cpu("5"), "name": "i"},
            {**cpu("2"), "name": "s", "restartPolicy": "Always"},
        ],
    }
    assert objects.effective_requests(spec)["cpu"] == 5000
    result, _ = schedule(
        pod(**spec), [node("n1", allocatable={"cpu": "6", "memory": "1Gi", "pods": "9"})]
    )
    assert result.node == "n1"


def test_pod_level_requests_are_what_the_pod_asks() -> None:
    # spec.resources (PodLevelResources, on by default since v1.34) replaces the containers' sum
    # for cpu and memory; ours read only the containers and overcommitted the node
    spec: Json = {
        "containers": [cpu("1")],
        "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
    }
    assert objects.effective_requests(spec) == {"cpu": 3000, "memory": 2**30, "pods": 1}
    result, text = schedule(
        pod(**spec), [node("n1", allocatable={"cpu": "2", "memory": "4Gi", "pods": "9"})]
    )
    assert result.node is None
    assert "Insufficient cpu" in text


def test_a_sidecars_host_port_is_held() -> None:
    port = [{"containerPort": 80, "hostPort": 80, "protocol": "TCP"}]
    sidecar = {"name": "s", "restartPolicy": "Always", "ports": port}
    held = pod("e", "n1", initContainers=[sidecar])
    want = pod(containers=[{"name": "c", "ports": port}])
    _, text = schedule(want, [node("n1")], [held])
    assert text == (
        "0/1 nodes are available: 1 NodePorts: node(s) didn't have free ports for the requested "
        "pod ports. preemption: 0/1 nodes are available: 1 No preemption victims found for "
        "incoming pod."
    )


def _names(*terms: list[str]) -> Json:
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


def test_nodes_no_term_names_are_not_evaluated() -> None:
    # every term names its node: kube-scheduler's PreFilter result; a cordoned node outside it
    # is "didn't satisfy plugin(s) [NodeAffinity]", not "were unschedulable"
    nodes = [
        node("n1", unschedulable=True),
        node("n2", allocatable={"cpu": "0", "memory": "0", "pods": "9"}),
    ]
    _, text = schedule(pod(affinity=_names(["n2"]), containers=[cpu("1")]), nodes)
    assert text == (
        "0/2 nodes are available: 1 NodeAffinity: node(s) didn't satisfy plugin(s) "
        "[NodeAffinity], 1 NodeResourcesFit: Insufficient cpu. preemption: 0/2 nodes are "
        "available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful "
        "for scheduling."
    )


def test_terms_naming_no_node_at_all_conflict() -> None:
    result, text = schedule(pod(affinity=_names(["n1", "n2"])), [node("n1"), node("n2")])
    assert result.node is None
    assert result.unresolvable
    assert text == "NodeAffinity: pod affinity terms conflict"
