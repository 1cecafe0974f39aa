"""The counting plugins' state after pods move in a what-if copy (kube-scheduler's
PreFilterExtensions AddPod/RemovePod) is exactly what their PreFilter computes over a cluster
where those pods really moved; and the pods nominated to a node count for them in every cycle
(kube-scheduler's RunFilterPluginsWithNominatedPods)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import CycleState, PodChange, Profile
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins import inter_pod_affinity as ipa
from lj_runtimekit_scheduler.plugins import node_resources_fit
from lj_runtimekit_scheduler.plugins import pod_topology_spread as pts
from lj_runtimekit_scheduler.state import ClusterState

HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
NODES = {"n0": "a", "n1": "a", "n2": "b", "n3": "b", "n4": "c"}
APPS = ("web", "db")


def _node(name: str, zone: str) -> Any:
    return objects.node(
        {
            "metadata": {"name": name, "labels": {HOST: name, ZONE: zone}},
            "status": {
                "allocatable": {"cpu": "64", "memory": "64Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def _term(app: str, key: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}


def _pod(
    name: str,
    app: str,
    *,
    anti: tuple[str, str] | None = None,
    affinity: tuple[str, str] | None = None,
    spread: bool = False,
    deleting: bool = False,
    ns: str = "ns",
) -> Pod:
    spec: dict[str, Any] = {
        "schedulerName": "lj-runtimekit-scheduler",
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    }
    aff: dict[str, Any] = {}
    if anti is not None:
        aff["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_term(*anti)]}
    if affinity is not None:
        aff["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_term(*affinity)]}
    if aff:
        spec["affinity"] = aff
    if spread:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
                "minDomains": 3,
            }
        ]
    meta: dict[str, Any] = {"uid": name, "name": name, "namespace": ns, "labels": {"app": app}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return objects.pod({"metadata": meta, "spec": spec})


placed_pod = st.fixed_dictionaries(
    {
        "app": st.sampled_from(APPS),
        "node": st.sampled_from(sorted(NODES)),
        "anti": st.none() | st.tuples(st.sampled_from(APPS), st.sampled_from((HOST, ZONE))),
        "deleting": st.booleans(),
        "ns": st.sampled_from(("ns", "other")),
    }
)


def _state(pods: list[tuple[Pod, str]]) -> ClusterState:
    state = ClusterState()
    for name, zone in NODES.items():
        state.set_node(_node(name, zone))
    for p, n in pods:
        state.add_pod(p, n)
    return state


def _verdicts(plugin: Any, cs: CycleState, pod: Pod, state: ClusterState) -> dict[str, str]:
    return {n: plugin.filter(cs, pod, info).reason for n, info in state.nodes.items()}


@settings(max_examples=150, deadline=None)
@given(
    before=st.lists(placed_pod, max_size=8),
    after=st.lists(placed_pod, max_size=4),
    off=st.sets(st.integers(0, 7)),
    incoming=st.fixed_dictionaries(
        {
            "anti": st.tuples(st.sampled_from(APPS), st.sampled_from((HOST, ZONE))),
            "affinity": st.none() | st.tuples(st.sampled_from(APPS), st.just(ZONE)),
        }
    ),
)
def test_moving_pods_gives_the_counts_of_the_cluster_they_moved_in(
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    off: set[int],
    incoming: dict[str, Any],
) -> None:
    def made(prefix: str, specs: list[dict[str, Any]]) -> list[tuple[Pod, str]]:
        return [
            (
                _pod(f"{prefix}{i}", s["app"], anti=s["anti"], deleting=s["deleting"], ns=s["ns"]),
                s["node"],
            )
            for i, s in enumerate(specs)
        ]

    placed, added = made("p", before), made("q", after)
    gone = [placed[i] for i in sorted(off) if i < len(placed)]
    pod = _pod("me", "web", spread=True, **incoming)
    changes: list[PodChange] = [(p, _node(n, NODES[n]), -1) for p, n in gone]
    changes += [(p, _node(n, NODES[n]), 1) for p, n in added]

    full = _state(placed)
    direct = _state([pn for pn in placed if pn not in gone] + added)
    for make in (lambda s: ipa.new(ipa.Args(), s), lambda s: pts.new(pts.Args(), s)):
        here, there = make(full), make(direct)
        cs, want = CycleState(), CycleState()
        assert here.pre_filter(cs, pod).ok
        assert there.pre_filter(want, pod).ok
        moved = cs.clone()
        here.update_with_pods(moved, pod, changes)
        assert _verdicts(here, moved, pod, full) == _verdicts(there, want, pod, direct)
        # the counts themselves, not only the verdicts
        got, exp = moved.read(_slot(here)), want.read(_slot(there))
        assert got is not None
        assert exp is not None
        if isinstance(got, ipa.FilterState):
            assert (got.affinity, got.anti, got.existing) == (exp.affinity, exp.anti, exp.existing)
        else:
            assert (got.counts, got.minimum) == (exp.counts, exp.minimum)
        # the cycle's own state is untouched: the clone got the new one
        assert cs.read(_slot(here)) is not got


def _slot(plugin: Any) -> Any:
    return ipa._FILTER if isinstance(plugin, ipa.InterPodAffinity) else pts._FILTER


def _profile(state: ClusterState) -> Profile:
    return Profile(
        [
            (node_resources_fit.NodeResourcesFit(True, state), 1),
            (pts.new(pts.Args(), state), 2),
            (ipa.new(ipa.Args(), state), 2),
        ]
    )


def _prioritized(p: Pod, priority: int) -> Pod:
    return objects.pod(
        {
            "metadata": {
                "uid": p.uid,
                "name": p.name,
                "namespace": p.namespace,
                "labels": p.label_map(),
            },
            "spec": {
                "priority": priority,
                "containers": [],
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST}
                        ]
                    }
                },
            },
        }
    )


def test_a_pod_s_anti_affinity_keeps_it_off_a_node_a_matching_pod_is_nominated_to() -> None:
    state = _state([])
    state.nominate(_pod("db", "db"), "n0", None)
    prof = _profile(state)
    web = _pod("w", "web", anti=("db", HOST))
    result = prof.find_node(CycleState(), web, state, ["n0"])
    assert result.node is None
    assert result.reasons == {"n0": f"InterPodAffinity: {ipa.ANTI_AFFINITY_MISMATCH}"}
    assert prof.find_node(CycleState(), web, state, ["n1"]).node == "n1"
    # a pod of higher priority than the nominated one need not leave it room
    assert prof.find_node(CycleState(), _prioritized(web, 20), state, ["n0"]).node == "n0"


def test_a_nominated_pod_s_anti_affinity_repels_only_a_pod_the_plugin_checks() -> None:
    # kube-scheduler's InterPodAffinity skips a pod with no terms of its own that no placed
    # pod repels (PreFilter Skip), nominated pods included; once a placed pod's anti-affinity
    # matches it, the nominated one's counts too
    state = _state([])
    state.nominate(_pod("guard", "db", anti=("web", HOST)), "n0", None)
    prof = _profile(state)
    web = _pod("w", "web")
    assert prof.find_node(CycleState(), web, state, ["n0"]).node == "n0"
    state.add_pod(_pod("far", "db", anti=("web", HOST)), "n4")
    result = prof.find_node(CycleState(), web, state, ["n0"])
    assert result.reasons == {"n0": f"InterPodAffinity: {ipa.EXISTING_ANTI_AFFINITY}"}


def test_a_nominated_replica_counts_for_the_spread_of_the_next_one_on_its_node() -> None:
    # zones a, b, c each hold one web replica; one more is nominated to n0 (zone a): a pod that
    # leaves it room sees zone a at two already on n0, so not there (skew 3 - 1 > 1); on n1,
    # zone a too, it is not counted (kube-scheduler adds nominated pods to their node only)
    placed = [(_pod(f"r{z}", "web"), n) for z, n in (("a", "n1"), ("b", "n2"), ("c", "n4"))]
    state = _state(placed)
    state.nominate(_pod("next", "web"), "n0", None)
    prof = _profile(state)
    me = _pod("me", "web", spread=True)
    result = prof.find_node(CycleState(), me, state, ["n0"])
    assert result.node is None
    assert result.reasons == {"n0": f"PodTopologySpread: {pts.MISMATCH}"}
    assert prof.find_node(CycleState(), me, state, ["n1"]).node == "n1"
