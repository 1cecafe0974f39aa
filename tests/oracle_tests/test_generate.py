"""The generator: reproducible, switchable by family, and varied enough that the cluster run
means something (judged by the checker alone, no cluster)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from lj_runtimekit_testkit.oracle import checker, generate
from lj_runtimekit_testkit.oracle.cases import KUBE, OURS, Case, Copy, node_manifest, pod_manifest


def test_a_case_is_the_same_alone_and_in_a_run() -> None:
    run = generate.generate_many(7, 30)
    assert [generate.generate(7, i) for i in (3, 17, 29)] == [run[3], run[17], run[29]]
    assert generate.generate_many(7, 30) == run
    assert generate.generate_many(8, 30) != run


def test_families_are_switches() -> None:
    only = generate.generate_many(1, 50, ("taints",))
    assert {c.families for c in only} == {("taints",)}
    assert all(not c.probes[0].spec.get("affinity") for c in only)
    assert any(n.taints for c in only for n in c.nodes)


@pytest.mark.parametrize("name", sorted(generate.PENDING))
def test_pending_families_are_refused_with_their_branch(name: str) -> None:
    with pytest.raises(ValueError, match="branch h35"):
        generate.enabled([name])


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown family 'volume'"):
        generate.enabled(["volume"])


def _as_apiserver_keeps_it(
    case: Case, who: str = KUBE
) -> tuple[dict[str, Any], list[Any], list[Any]]:
    copy = Copy(case, "r", 1, who, "ns", "s")
    nodes = [node_manifest(copy, n) for n in case.nodes]
    pods = [pod_manifest(copy, p, "existing") for p in case.existing]
    probe = pod_manifest(copy, case.probes[0], "probe")
    for i, p in enumerate([probe, *pods]):
        p["metadata"]["uid"] = str(i)
        for c in p["spec"].get("containers", []) + p["spec"].get("initContainers", []):
            res = c.get("resources") or {}
            res["requests"] = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return probe, nodes, pods


def test_probes_fit_somewhere_about_as_often_as_not() -> None:
    verdicts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for case in generate.generate_many(35, 300):
        probe, nodes, pods = _as_apiserver_keeps_it(case)
        e = checker.expect(probe, nodes, pods)
        verdicts["gated" if e.gated else "fits" if e.feasible else "refused"] += 1
        reasons.update(e.histogram().keys())
    assert verdicts["fits"] > 60, verdicts
    assert verdicts["refused"] > 60, verdicts
    # every reason kube-scheduler can give for these families comes up
    for reason in (
        checker.AFFINITY,
        checker.PREFILTERED,
        checker.UNTOLERATED,
        checker.UNSCHEDULABLE,
        checker.PORTS,
        checker.TOO_MANY_PODS,
        "Insufficient cpu",
        "Insufficient memory",
        "Insufficient example.com/widget",
    ):
        assert reasons[reason] > 3, (reason, reasons)


def test_pods_already_bound_fit_their_nodes() -> None:
    for case in generate.generate_many(35, 200):
        _, nodes, pods = _as_apiserver_keeps_it(case)
        for n in nodes:
            here = [p for p in pods if p["spec"]["nodeName"] == n["metadata"]["name"]]
            for i, p in enumerate(here):
                others = here[:i]
                assert not checker.resource_reasons(checker.pod_requests(p), n, others), (
                    case.describe()
                )
                used = [port for o in others for port in checker.host_ports(o)]
                assert not checker.ports_conflict(checker.host_ports(p), used), case.describe()


def test_what_the_apiserver_would_refuse_is_never_generated() -> None:
    for case in generate.generate_many(35, 300):
        spec = case.probes[0].spec
        assert not (spec.get("nodeName") and spec.get("schedulingGates"))
        for tol in spec.get("tolerations") or ():
            assert "tolerationSeconds" not in tol or tol.get("effect") == "NoExecute"
            assert tol.get("key") or tol.get("operator") == "Exists"
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            res = c.get("resources") or {}
            if generate.WIDGET in (res.get("requests") or {}):
                assert res["limits"][generate.WIDGET] == res["requests"][generate.WIDGET]


def test_the_two_copies_differ_only_in_their_names() -> None:
    case = generate.generate(35, 11)
    k, o = (Copy(case, "r", 1, who, f"ns-{who}", "s") for who in (KUBE, OURS))
    nk, no = node_manifest(k, case.nodes[0]), node_manifest(o, case.nodes[0])
    assert nk["metadata"]["name"] != no["metadata"]["name"]
    assert nk["status"] == no["status"]
    assert nk["spec"] == no["spec"]
    pk, po = pod_manifest(k, case.probes[0], "probe"), pod_manifest(o, case.probes[0], "probe")
    assert pk["spec"]["nodeSelector"]["oracle.lj-runtimekit.io/case"] == k.token
    assert pk["metadata"]["name"] == po["metadata"]["name"]


def test_gpu_cases_ask_for_our_resources() -> None:
    cases = [generate.generate(3, i, ("gpu",)) for i in range(20)]
    assert all(c.gpu and c.families == ("gpu",) for c in cases)
    asked = {
        r for c in cases for p in c.probes for r in p.spec["containers"][0]["resources"]["limits"]
    }
    assert asked == {"aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory"}


def test_a_case_describes_itself_with_the_command_that_reproduces_it() -> None:
    text = generate.generate(35, 4).describe()
    assert "--seed 35 --only 4" in text
    assert "probe probe:" in text
