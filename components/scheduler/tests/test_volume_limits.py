"""NodeVolumeLimits and VolumeRestrictions: kube-scheduler's verdicts, table by table.

Upstream: pkg/scheduler/framework/plugins/nodevolumelimits/csi.go (CSILimits: the node's CSINode
allocatable count per driver against the unique volumes of the pods there plus the new ones)
and pkg/scheduler/framework/plugins/volumerestrictions (ReadWriteOncePod; in-tree disk
conflicts).
"""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins.node_volume_limits import EXCEEDED, NodeVolumeLimits
from lj_runtimekit_scheduler.plugins.volume_restrictions import (
    DISK_CONFLICT,
    RWOP_CONFLICT,
    VolumeRestrictions,
)
from lj_runtimekit_scheduler.state import ClusterState
from lj_runtimekit_scheduler.storage import KINDS

Json = dict[str, Any]
DRIVER = "ebs.csi.example.com"


def pvc(name: str, volume: str = "", modes: tuple[str, ...] = ("ReadWriteOnce",)) -> Json:
    spec: Json = {"accessModes": list(modes), "storageClassName": "csi"}
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}, "spec": spec}


def csi_pv(name: str, handle: str | None = None) -> Json:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "csi": {"driver": DRIVER, "volumeHandle": handle or name},
        },
    }


def pod(name: str, *claims: str, node: str = "", volumes: list[Json] | None = None) -> Pod:
    vols = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    spec: Json = {"containers": [{"name": "c"}], "volumes": vols + (volumes or [])}
    if node:
        spec["nodeName"] = node
    return objects.pod(
        {
            "metadata": {"uid": f"uid-{name}", "name": name, "namespace": "ns"},
            "spec": spec,
            "status": {"phase": "Running" if node else "Pending"},
        }
    )


def setup(limit: int | None, *objs: tuple[str, Json], placed: tuple[Pod, ...] = ()) -> ClusterState:
    state = ClusterState()
    for kind in KINDS:
        state.storage.relist(kind, [])
    state.storage.apply(
        "storageclasses", "ADDED", {"metadata": {"name": "csi"}, "provisioner": DRIVER}
    )
    for kind, raw in objs:
        state.storage.apply(kind, "ADDED", raw)
    state.set_node(
        objects.node(
            {
                "metadata": {"name": "n1"},
                "status": {
                    "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    )
    if limit is not None:
        drivers = [{"name": DRIVER, "nodeID": "n1", "allocatable": {"count": limit}}]
        state.storage.apply(
            "csinodes", "ADDED", {"metadata": {"name": "n1"}, "spec": {"drivers": drivers}}
        )
    for p in placed:
        state.observe_pod(p)
    return state


def claims(*raws: Json) -> list[tuple[str, Json]]:
    return [("persistentvolumeclaims", r) for r in raws]


def pvs(*raws: Json) -> list[tuple[str, Json]]:
    return [("persistentvolumes", r) for r in raws]


BOUND = claims(pvc("a", "pv-a"), pvc("b", "pv-b"), pvc("c", "pv-c")) + pvs(
    csi_pv("pv-a"), csi_pv("pv-b"), csi_pv("pv-c")
)


@pytest.mark.parametrize(
    ("limit", "new", "placed", "fits"),
    [
        (2, ("a",), (("b",),), True),
        (2, ("a",), (("b",), ("c",)), False),
        (2, ("a", "b"), (("c",),), False),
        # a volume already attached for another pod counts once
        (2, ("a",), (("a",), ("b",)), True),
        # no limit reported: anything goes
        (None, ("a", "b"), (("c",),), True),
        # an unbound claim counts under its class's provisioner, once however many pods share it
        (1, ("new",), (), True),
        (1, ("new",), (("new",),), True),
        (1, ("new",), (("a",),), False),
    ],
    ids=[
        "under",
        "at-limit",
        "two-new",
        "shared-volume-once",
        "no-limit",
        "unbound-alone",
        "unbound-shared",
        "unbound-over",
    ],
)
def test_node_volume_limits(
    limit: int | None, new: tuple[str, ...], placed: tuple[tuple[str, ...], ...], fits: bool
) -> None:
    others = tuple(pod(f"o{i}", *c, node="n1") for i, c in enumerate(placed))
    state = setup(limit, *BOUND, *claims(pvc("new")), placed=others)
    plugin = NodeVolumeLimits(state)
    st = plugin.filter(CycleState(), pod("p", *new), state.nodes["n1"])
    assert st.ok is fits
    assert st.reason == ("" if fits else EXCEEDED)


def test_node_volume_limits_needs_the_claim_and_skips_pods_without() -> None:
    state = setup(1)
    plugin = NodeVolumeLimits(state)
    assert plugin.pre_filter(CycleState(), pod("p")).skip
    st = plugin.filter(CycleState(), pod("p", "missing"), state.nodes["n1"])
    assert st.reason == 'looking up PVC ns/missing: persistentvolumeclaim "missing" not found'
    assert st.unresolvable


def test_the_node_s_legacy_attach_limit_counts_too() -> None:
    state = setup(None, *BOUND)
    node = objects.node(
        {
            "metadata": {"name": "n1"},
            "status": {
                "allocatable": {"pods": "110", f"attachable-volumes-csi-{DRIVER}": "1"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    state.set_node(node)
    state.observe_pod(pod("o", "b", node="n1"))
    st = NodeVolumeLimits(state).filter(CycleState(), pod("p", "a"), state.nodes["n1"])
    assert st.reason == EXCEEDED


RWOP = ("ReadWriteOncePod",)


@pytest.mark.parametrize(
    ("objs", "placed", "reason"),
    [
        (claims(pvc("x", modes=RWOP)), (pod("o", "x", node="n1"),), RWOP_CONFLICT),
        (claims(pvc("x", modes=RWOP)), (), ""),
        # ReadWriteOnce is per node, which this plugin does not check (the kubelet and attach do)
        (claims(pvc("x")), (pod("o", "x", node="n1"),), ""),
        (claims(pvc("x", modes=RWOP)), (pod("o", "y", node="n1"),), ""),
    ],
    ids=["rwop-in-use", "rwop-free", "rwo-shared", "other-claim"],
)
def test_read_write_once_pod(
    objs: list[tuple[str, Json]], placed: tuple[Pod, ...], reason: str
) -> None:
    state = setup(None, *objs, *claims(pvc("y")), placed=placed)
    plugin = VolumeRestrictions(state)
    cs = CycleState()
    me = pod("p", "x")
    pre = plugin.pre_filter(cs, me)
    assert pre.ok
    if reason == "":
        assert pre.skip
        return
    st = plugin.filter(cs, me, state.nodes["n1"])
    assert st.reason == reason
    assert not st.unresolvable  # preemption of the pod using it may help


def test_read_write_once_pod_needs_the_claim() -> None:
    st = VolumeRestrictions(setup(None)).pre_filter(CycleState(), pod("p", "x"))
    assert st.reason == 'persistentvolumeclaim "x" not found'
    assert st.unresolvable


def gce(name: str, ro: bool = False) -> Json:
    return {"name": "d", "gcePersistentDisk": {"pdName": name, "readOnly": ro}}


def ebs(vid: str, ro: bool = False) -> Json:
    return {"name": "d", "awsElasticBlockStore": {"volumeID": vid, "readOnly": ro}}


def iscsi(iqn: str, ro: bool = False) -> Json:
    return {"name": "d", "iscsi": {"iqn": iqn, "targetPortal": "t", "lun": 0, "readOnly": ro}}


def rbd(mons: list[str], image: str, ro: bool = False) -> Json:
    return {"name": "d", "rbd": {"monitors": mons, "pool": "p", "image": image, "readOnly": ro}}


@pytest.mark.parametrize(
    ("mine", "theirs", "conflict"),
    [
        (gce("a"), gce("a"), True),
        (gce("a", True), gce("a", True), False),
        (gce("a", True), gce("a"), True),
        (gce("a"), gce("b"), False),
        (ebs("v"), ebs("v", True), True),
        (ebs("v"), ebs("w"), False),
        (iscsi("q"), iscsi("q"), True),
        (iscsi("q", True), iscsi("q", True), False),
        (rbd(["m1", "m2"], "i"), rbd(["m2"], "i"), True),
        (rbd(["m1"], "i"), rbd(["m2"], "i"), False),
        (rbd(["m1"], "i", True), rbd(["m1"], "i", True), False),
        (gce("a"), ebs("a"), False),
    ],
    ids=[
        "gce-rw",
        "gce-ro",
        "gce-mixed",
        "gce-other",
        "ebs-always",
        "ebs-other",
        "iscsi-rw",
        "iscsi-ro",
        "rbd-shared-monitor",
        "rbd-other-monitors",
        "rbd-ro",
        "different-kinds",
    ],
)
def test_in_tree_disk_conflicts(mine: Json, theirs: Json, conflict: bool) -> None:
    state = setup(None, placed=(pod("o", node="n1", volumes=[theirs]),))
    plugin = VolumeRestrictions(state)
    cs = CycleState()
    me = pod("p", volumes=[mine])
    assert plugin.pre_filter(cs, me).ok
    st = plugin.filter(cs, me, state.nodes["n1"])
    assert st.reason == (DISK_CONFLICT if conflict else "")
