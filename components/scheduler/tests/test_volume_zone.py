"""VolumeZone: kube-scheduler's verdicts (pkg/scheduler/framework/plugins/volumezone), table by
table: the zone and region labels of a pod's bound PVs against the node's labels."""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins.volume_zone import (
    BETA_ZONE,
    CONFLICT,
    REGION,
    ZONE,
    VolumeZone,
    zones,
)
from lj_runtimekit_scheduler.settings import DEFAULT_PLUGINS
from lj_runtimekit_scheduler.state import ClusterState
from lj_runtimekit_scheduler.storage import KINDS

Json = dict[str, Any]


def pvc(name: str, volume: str = "", cls: str = "standard") -> Json:
    spec: Json = {"accessModes": ["ReadWriteOnce"], "storageClassName": cls}
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}, "spec": spec}


def pv(name: str, **labels: str) -> Json:
    return {
        "metadata": {"name": name, "labels": {k.replace("_", "/"): v for k, v in labels.items()}},
        "spec": {"capacity": {"storage": "1Gi"}, "hostPath": {"path": "/x"}},
    }


def pod(*claims: str, ephemeral: bool = False) -> Pod:
    vols: list[Json] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    if ephemeral:
        vols.append({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
    return objects.pod(
        {
            "metadata": {"uid": "uid-p", "name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "volumes": vols},
            "status": {"phase": "Pending"},
        }
    )


def cluster(*objs: tuple[str, Json], nodes: dict[str, dict[str, str]]) -> ClusterState:
    state = ClusterState()
    for kind in KINDS:
        state.storage.relist(kind, [])
    for name, mode in (("standard", "Immediate"), ("local", "WaitForFirstConsumer")):
        state.storage.apply(
            "storageclasses",
            "ADDED",
            {"metadata": {"name": name}, "provisioner": "x", "volumeBindingMode": mode},
        )
    for kind, raw in objs:
        state.storage.apply(kind, "ADDED", raw)
    for name, labels in nodes.items():
        state.set_node(
            objects.node(
                {
                    "metadata": {"name": name, "labels": labels},
                    "status": {
                        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
        )
    return state


def verdicts(state: ClusterState, p: Pod) -> dict[str, bool] | str:
    """node → fits, or the PreFilter's failure (``skip`` when it skips)."""
    plugin = VolumeZone(state)
    cs = CycleState()
    pre = plugin.pre_filter(cs, p)
    if pre.skip:
        return "skip"
    if not pre.ok:
        return pre.reason
    return {n: plugin.filter(cs, p, info).ok for n, info in sorted(state.nodes.items())}


NODES = {
    "a1": {ZONE: "a", REGION: "r1"},
    "b1": {ZONE: "b", REGION: "r1"},
    "beta-a": {BETA_ZONE: "a"},
    "bare": {},
    "region-only": {REGION: "r2"},
}


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        # the GA zone: only its nodes; a node with no zone or region label fits anything
        (
            {"topology.kubernetes.io_zone": "a"},
            {"a1": True, "b1": False, "beta-a": False, "bare": True, "region-only": False},
        ),
        # several zones in one label
        (
            {"topology.kubernetes.io_zone": "a__b"},
            {"a1": True, "b1": True, "beta-a": False, "bare": True, "region-only": False},
        ),
        # a beta PV label matches the node's GA label, and the node's beta one
        (
            {"failure-domain.beta.kubernetes.io_zone": "a"},
            {"a1": True, "b1": False, "beta-a": True, "bare": True, "region-only": False},
        ),
        # zone and region both
        (
            {"topology.kubernetes.io_zone": "a", "topology.kubernetes.io_region": "r1"},
            {"a1": True, "b1": False, "beta-a": False, "bare": True, "region-only": False},
        ),
        (
            {"topology.kubernetes.io_region": "r2"},
            {"a1": False, "b1": False, "beta-a": False, "bare": True, "region-only": True},
        ),
    ],
    ids=["ga-zone", "zone-list", "beta-label", "zone-and-region", "region"],
)
def test_bound_pv_labels_decide_the_nodes(labels: dict[str, str], want: dict[str, bool]) -> None:
    state = cluster(
        ("persistentvolumeclaims", pvc("c", "pv")),
        ("persistentvolumes", pv("pv", **labels)),
        nodes=NODES,
    )
    assert verdicts(state, pod("c")) == want


def test_a_node_that_fails_is_told_in_kube_schedulers_words() -> None:
    state = cluster(
        ("persistentvolumeclaims", pvc("c", "pv")),
        ("persistentvolumes", pv("pv", **{"topology.kubernetes.io_zone": "a"})),
        nodes={"b1": NODES["b1"]},
    )
    plugin, cs, p = VolumeZone(state), CycleState(), pod("c")
    assert plugin.pre_filter(cs, p).ok
    st = plugin.filter(cs, p, state.nodes["b1"])
    assert (st.ok, st.reason, st.unresolvable) == (False, CONFLICT, True)


@pytest.mark.parametrize(
    ("objs", "claims", "want"),
    [
        ([], (), "skip"),
        # a PV without zone labels, or with an unparsable one, constrains nothing
        ([("c", "pv", {})], ("c",), "skip"),
        ([("c", "pv", {"topology.kubernetes.io_zone": "a____b"})], ("c",), "skip"),
        # an unbound WaitForFirstConsumer claim: VolumeBinding picks its PV
        ([("c", "", "local")], ("c",), "skip"),
        ([("c", "", "standard")], ("c",), "PersistentVolume had no name"),
        ([("c", "", "")], ("c",), "PersistentVolumeClaim had no pv name and storageClass name"),
        ([("c", "", "gone")], ("c",), 'storageclass.storage.k8s.io "gone" not found'),
        ([], ("c",), 'persistentvolumeclaim "c" not found'),
        ([("c", "missing", None)], ("c",), 'persistentvolume "missing" not found'),
    ],
    ids=[
        "no-claims",
        "unlabelled-pv",
        "bad-label",
        "wffc-unbound",
        "immediate-unbound",
        "no-class",
        "class-gone",
        "claim-gone",
        "pv-gone",
    ],
)
def test_pre_filter(objs: list[tuple[Any, ...]], claims: tuple[str, ...], want: str) -> None:
    raw: list[tuple[str, Json]] = []
    for entry in objs:
        name, volume, extra = entry
        if volume and isinstance(extra, dict):
            raw.append(("persistentvolumeclaims", pvc(name, volume)))
            raw.append(("persistentvolumes", pv(volume, **extra)))
        elif volume:
            raw.append(("persistentvolumeclaims", pvc(name, volume)))
        else:
            raw.append(("persistentvolumeclaims", pvc(name, cls=extra)))
    assert verdicts(cluster(*raw, nodes=NODES), pod(*claims)) == want


def test_ephemeral_volumes_are_not_looked_at() -> None:
    """kube-scheduler's VolumeZone reads only ``persistentVolumeClaim`` volumes; the claim of an
    ephemeral volume is not there yet and does not fail the pod here."""
    assert verdicts(cluster(nodes=NODES), pod(ephemeral=True)) == "skip"


def test_zones_parses_kube_schedulers_list() -> None:
    assert zones("a") == frozenset({"a"})
    assert zones("a__b__c") == frozenset({"a", "b", "c"})
    assert zones("a__") is None


def test_on_by_default_after_volume_binding() -> None:
    names = [n for n, _ in DEFAULT_PLUGINS]
    assert names.index("VolumeZone") == names.index("VolumeBinding") + 1
