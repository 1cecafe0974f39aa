"""VolumeBinding: kube-scheduler's verdicts on a pod's claims, table by table, then Reserve /
Unreserve in the assume cache and the PreBind wait for the PV controller.

The expected verdicts are kube-scheduler's (pkg/scheduler/framework/plugins/volumebinding:
volume_binding.go PreFilter/Filter, binder.go FindPodVolumes/checkBindings, and the PV
controller's FindMatchingVolume in component-helpers/storage/volume), reason for reason.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest

from lj_runtimekit_scheduler import objects, volume_binder
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.plugins import volume_binding
from lj_runtimekit_scheduler.plugins.volume_binding import VolumeBinding
from lj_runtimekit_scheduler.state import ClusterState
from lj_runtimekit_scheduler.storage import KINDS, Storage
from lj_runtimekit_scheduler.volume_binder import (
    BIND_CONFLICT,
    NODE_CONFLICT,
    NOT_ENOUGH_SPACE,
    PV_NOT_EXIST,
    UNBOUND_IMMEDIATE,
)

Json = dict[str, Any]
LOCAL = "kubernetes.io/no-provisioner"
CSI = "csi.example.com"


def pvc(
    name: str,
    *,
    sc: str | None = "local",
    size: str | None = "10Gi",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    volume: str = "",
    bound: bool = False,
    selected: str | None = None,
    rv: str = "1",
    **extra: Any,
) -> Json:
    ann: dict[str, str] = {}
    if bound:
        ann["pv.kubernetes.io/bind-completed"] = "yes"
    if selected is not None:
        ann["volume.kubernetes.io/selected-node"] = selected
    spec: Json = {"accessModes": list(modes)}
    if sc is not None:
        spec["storageClassName"] = sc
    if size is not None:
        spec["resources"] = {"requests": {"storage": size}}
    if volume:
        spec["volumeName"] = volume
    spec.update(extra.pop("spec", {}))
    meta: Json = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "annotations": ann,
        **extra.pop("meta", {}),
    }
    return {"metadata": meta, "spec": spec, "status": {"phase": extra.pop("phase", "Pending")}}


def pv(
    name: str,
    *,
    sc: str = "local",
    size: str = "10Gi",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    node: str | None = None,
    claim: str | None = None,
    phase: str = "Available",
    rv: str = "1",
    **extra: Any,
) -> Json:
    spec: Json = {
        "capacity": {"storage": size},
        "accessModes": list(modes),
        "storageClassName": sc,
        **extra.pop("spec", {}),
    }
    if node is not None:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                        ]
                    }
                ]
            }
        }
    if claim is not None:
        spec["claimRef"] = {"namespace": "ns", "name": claim, "uid": f"uid-{claim}"}
    meta = {"name": name, "resourceVersion": rv, **extra.pop("meta", {})}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def sc(
    name: str = "local",
    mode: str = "WaitForFirstConsumer",
    provisioner: str = LOCAL,
    zones: tuple[str, ...] = (),
) -> Json:
    out: Json = {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}
    if zones:
        out["allowedTopologies"] = [
            {"matchLabelExpressions": [{"key": "zone", "values": list(zones)}]}
        ]
    return out


def capacity(name: str, size: str, zone: str, cls: str = "fast", **extra: Any) -> Json:
    return {
        "metadata": {"name": name, "namespace": "kube-system"},
        "storageClassName": cls,
        "capacity": size,
        "nodeTopology": {"matchLabels": {"zone": zone}},
        **extra,
    }


def load(*objs: tuple[str, Json]) -> Storage:
    """A storage cache with every kind listed and ``objs`` (kind, raw) in it."""
    s = Storage()
    for kind in KINDS:
        s.relist(kind, [])
    for kind, raw in objs:
        s.apply(kind, "ADDED", raw)
    return s


def claims(*raws: Json) -> list[tuple[str, Json]]:
    return [("persistentvolumeclaims", r) for r in raws]


def pvs(*raws: Json) -> list[tuple[str, Json]]:
    return [("persistentvolumes", r) for r in raws]


def classes(*raws: Json) -> list[tuple[str, Json]]:
    return [("storageclasses", r) for r in raws]


def pod(*claim_names: str, ephemeral: tuple[str, ...] = (), uid: str = "pod-uid") -> Pod:
    vols: list[Json] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
        for i, c in enumerate(claim_names)
    ]
    vols += [{"name": e, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}} for e in ephemeral]
    return objects.pod(
        {
            "metadata": {"uid": uid, "name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "volumes": vols},
        }
    )


def node(name: str = "n1", **labels: str) -> Any:
    return objects.node(
        {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def cluster(storage: Storage, *nodes: Any) -> ClusterState:
    state = ClusterState()
    state.storage = storage
    for n in nodes or (node("n1"), node("n2")):
        state.set_node(n)
    return state


# --- PreFilter: volume_binding.go PreFilter / podHasPVCs / GetPodVolumeClaims
OWNED = {"ownerReferences": [{"uid": "pod-uid", "controller": True, "kind": "Pod", "name": "p"}]}
FOREIGN = {"ownerReferences": [{"uid": "other", "controller": True, "kind": "Pod", "name": "q"}]}


@pytest.mark.parametrize(
    ("the_pod", "objs", "reason", "nodes"),
    [
        (pod("data"), claims(), 'persistentvolumeclaim "data" not found', None),
        (
            pod(ephemeral=("scratch",)),
            claims(),
            "waiting for ephemeral volume controller to create the persistentvolumeclaim "
            '"p-scratch"',
            None,
        ),
        (
            pod(ephemeral=("scratch",)),
            claims(pvc("p-scratch", meta=FOREIGN)),
            "PVC ns/p-scratch was not created for pod ns/p (pod is not owner)",
            None,
        ),
        (
            pod(ephemeral=("scratch",)),
            claims(pvc("p-scratch", meta=OWNED)) + classes(sc()),
            "",
            None,
        ),
        (
            pod("data"),
            claims(pvc("data", volume="gone", phase="Lost")),
            'persistentvolumeclaim "data" bound to non-existent persistentvolume "gone"',
            None,
        ),
        (
            pod("data"),
            claims(pvc("data", meta={"deletionTimestamp": "2026-01-01T00:00:00Z"})),
            'persistentvolumeclaim "data" is being deleted',
            None,
        ),
        (pod("data"), claims(pvc("data")) + classes(sc(mode="Immediate")), UNBOUND_IMMEDIATE, None),
        (pod("data"), claims(pvc("data")), UNBOUND_IMMEDIATE, None),  # class missing: Immediate
        (pod("data"), claims(pvc("data", sc=None)), UNBOUND_IMMEDIATE, None),  # no class
        # prebound to a PV but not bound yet: the PV controller's, treated as immediate
        (pod("data"), claims(pvc("data", volume="pv1")) + classes(sc()), UNBOUND_IMMEDIATE, None),
        (pod("data"), claims(pvc("data")) + classes(sc()), "", None),
        (
            pod("data"),
            claims(pvc("data", volume="pv1", bound=True)) + pvs(pv("pv1", node="n2")),
            "",
            frozenset({"n2"}),
        ),
        (
            pod("data"),
            claims(pvc("data", volume="pv1", bound=True)) + pvs(pv("pv1")),
            "",
            None,
        ),
    ],
    ids=[
        "claim-missing",
        "ephemeral-not-made-yet",
        "ephemeral-of-another-pod",
        "ephemeral-owned",
        "claim-lost",
        "claim-deleting",
        "immediate-unbound",
        "class-missing-is-immediate",
        "no-class-is-immediate",
        "prebound-is-immediate",
        "wait-for-first-consumer",
        "bound-local-pv-narrows-nodes",
        "bound-network-pv-any-node",
    ],
)
def test_pre_filter(
    the_pod: Pod, objs: list[tuple[str, Json]], reason: str, nodes: frozenset[str] | None
) -> None:
    plugin = VolumeBinding(cluster(load(*objs)))
    st = plugin.pre_filter(CycleState(), the_pod)
    assert st.ok is (not reason), st
    assert st.reason == reason
    assert st.unresolvable is bool(reason)
    assert st.nodes == nodes


def test_a_pod_without_claims_is_skipped_and_an_unlisted_cache_waits() -> None:
    assert VolumeBinding(cluster(load())).pre_filter(CycleState(), pod()).skip
    st = VolumeBinding(cluster(Storage())).pre_filter(CycleState(), pod("data"))
    assert not st.ok
    assert st.reason == volume_binding.NOT_LISTED
    assert not st.unresolvable


# --- Filter: FindPodVolumes (binder_test.go TestFindPodVolumesWithoutProvisioning/-Provisioning)
WFFC = classes(sc())
FAST = sc("fast", provisioner=CSI)


def delayed(*raws: Json) -> list[tuple[str, Json]]:
    return claims(*raws) + WFFC


@pytest.mark.parametrize(
    ("objs", "names", "reasons", "chosen"),
    [
        (claims(pvc("d", volume="pv1", bound=True)) + pvs(pv("pv1", node="n1")), ["d"], (), []),
        (
            claims(pvc("d", volume="pv1", bound=True)) + pvs(pv("pv1", node="n2")),
            ["d"],
            (NODE_CONFLICT,),
            [],
        ),
        (claims(pvc("d", volume="pv1", bound=True)), ["d"], (PV_NOT_EXIST,), []),
        (delayed(pvc("d")) + pvs(pv("pv1", node="n1")), ["d"], (), ["pv1"]),
        (delayed(pvc("d")) + pvs(pv("pv1", node="n2")), ["d"], (BIND_CONFLICT,), []),
        (delayed(pvc("d")) + pvs(pv("pv1", size="5Gi")), ["d"], (BIND_CONFLICT,), []),
        (
            delayed(pvc("d", modes=("ReadWriteMany",))) + pvs(pv("pv1")),
            ["d"],
            (BIND_CONFLICT,),
            [],
        ),
        (delayed(pvc("d")) + pvs(pv("pv1", sc="other")), ["d"], (BIND_CONFLICT,), []),
        (delayed(pvc("d")) + pvs(pv("pv1", claim="someone")), ["d"], (BIND_CONFLICT,), []),
        (delayed(pvc("d")) + pvs(pv("pv1", phase="Released")), ["d"], (BIND_CONFLICT,), []),
        (
            delayed(pvc("d")) + pvs(pv("pv1", meta={"deletionTimestamp": "x"})),
            ["d"],
            (BIND_CONFLICT,),
            [],
        ),
        (
            delayed(pvc("d", spec={"volumeMode": "Block"})) + pvs(pv("pv1")),
            ["d"],
            (BIND_CONFLICT,),
            [],
        ),
        (
            delayed(pvc("d"))
            + pvs(pv("small", size="5Gi"), pv("big", size="50Gi"), pv("mid", size="20Gi")),
            ["d"],
            (),
            ["mid"],
        ),
        (
            delayed(pvc("d", spec={"selector": {"matchLabels": {"tier": "gold"}}}))
            + pvs(pv("plain"), pv("gold", size="90Gi", meta={"labels": {"tier": "gold"}})),
            ["d"],
            (),
            ["gold"],
        ),
        (
            delayed(pvc("d", spec={"selector": {"matchLabels": {"tier": "gold"}}}))
            + pvs(pv("plain")),
            ["d"],
            (BIND_CONFLICT,),
            [],
        ),
        # two claims and one PV that fits both: each PV is given once (the smaller claim first)
        (
            delayed(pvc("a", size="1Gi"), pvc("b")) + pvs(pv("pv1")),
            ["a", "b"],
            (BIND_CONFLICT,),
            [],
        ),
        (
            delayed(pvc("a", size="1Gi"), pvc("b"))
            + pvs(pv("pv1", size="2Gi"), pv("pv2", size="10Gi")),
            ["a", "b"],
            (),
            ["pv1", "pv2"],
        ),
        # a PV prebound to the claim is its match when reachable, and no other PV is taken
        (
            delayed(pvc("d")) + pvs(pv("pre", claim="d", phase="Bound"), pv("free")),
            ["d"],
            (),
            ["pre"],
        ),
        (
            delayed(pvc("d")) + pvs(pv("pre", claim="d", node="n2"), pv("free")),
            ["d"],
            (BIND_CONFLICT,),
            [],
        ),
        # both reasons, in FindPodVolumes' order
        (
            delayed(pvc("b", volume="pv1", bound=True), pvc("u"))
            + pvs(pv("pv1", node="n2", claim="b")),
            ["b", "u"],
            (NODE_CONFLICT, BIND_CONFLICT),
            [],
        ),
    ],
    ids=[
        "bound-reachable",
        "bound-other-node",
        "bound-pv-missing",
        "local-pv-here",
        "local-pv-elsewhere",
        "pv-too-small",
        "access-modes",
        "other-class",
        "pv-taken",
        "pv-released",
        "pv-deleting",
        "volume-mode",
        "smallest-that-fits",
        "selector-matches",
        "selector-mismatch",
        "one-pv-two-claims",
        "two-pvs-two-claims",
        "prebound-pv",
        "prebound-pv-unreachable",
        "bound-and-unbound-reasons",
    ],
)
def test_filter_static(
    objs: list[tuple[str, Json]], names: list[str], reasons: tuple[str, ...], chosen: list[str]
) -> None:
    state = cluster(load(*objs))
    plugin = VolumeBinding(state)
    cs = CycleState()
    p = pod(*names)
    assert plugin.pre_filter(cs, p).ok
    st = plugin.filter(cs, p, state.nodes["n1"])
    assert st.ok is (not reasons)
    assert st.reason == ", ".join(reasons)
    if not reasons:
        found = cs.read(volume_binding._CYCLE).by_node["n1"]  # type: ignore[union-attr]
        assert sorted(b.volume.name for b in found.bindings) == sorted(chosen)


@pytest.mark.parametrize(
    ("objs", "labels", "reasons", "provisions"),
    [
        (claims(pvc("d", sc="fast")) + classes(FAST), {"zone": "a"}, (), ["d"]),
        (
            claims(pvc("d", sc="fast")) + classes(sc("fast", provisioner=CSI, zones=("a",))),
            {"zone": "a"},
            (),
            ["d"],
        ),
        (
            claims(pvc("d", sc="fast")) + classes(sc("fast", provisioner=CSI, zones=("a",))),
            {"zone": "b"},
            (BIND_CONFLICT,),
            [],
        ),
        # a static PV matching wins over provisioning
        (claims(pvc("d", sc="fast")) + classes(FAST) + pvs(pv("pv1", sc="fast")), {}, (), []),
        # capacity is checked only for a CSI driver that opts in
        (
            claims(pvc("d", sc="fast"))
            + classes(FAST)
            + [("csidrivers", {"metadata": {"name": CSI}, "spec": {"storageCapacity": True}})]
            + [("csistoragecapacities", capacity("c1", "5Gi", "a"))],
            {"zone": "a"},
            (NOT_ENOUGH_SPACE,),
            [],
        ),
        (
            claims(pvc("d", sc="fast"))
            + classes(FAST)
            + [("csidrivers", {"metadata": {"name": CSI}, "spec": {"storageCapacity": True}})]
            + [("csistoragecapacities", capacity("c1", "50Gi", "a"))],
            {"zone": "a"},
            (),
            ["d"],
        ),
        (
            claims(pvc("d", sc="fast"))
            + classes(FAST)
            + [("csidrivers", {"metadata": {"name": CSI}, "spec": {"storageCapacity": True}})]
            + [("csistoragecapacities", capacity("c1", "50Gi", "b"))],
            {"zone": "a"},
            (NOT_ENOUGH_SPACE,),
            [],
        ),
        (
            claims(pvc("d", sc="fast"))
            + classes(FAST)
            + [("csidrivers", {"metadata": {"name": CSI}, "spec": {"storageCapacity": True}})]
            + [("csistoragecapacities", capacity("c1", "50Gi", "a", maximumVolumeSize="5Gi"))],
            {"zone": "a"},
            (NOT_ENOUGH_SPACE,),
            [],
        ),
        (
            claims(pvc("d", sc="fast"))
            + classes(FAST)
            + [("csidrivers", {"metadata": {"name": CSI}, "spec": {"storageCapacity": False}})],
            {"zone": "a"},
            (),
            ["d"],
        ),
        # provisioning started for a node: only that node
        (claims(pvc("d", sc="fast", selected="n1")) + classes(FAST), {}, (), ["d"]),
        (claims(pvc("d", sc="fast", selected="n2")) + classes(FAST), {}, (BIND_CONFLICT,), []),
    ],
    ids=[
        "provisionable",
        "allowed-topology",
        "topology-refuses",
        "static-before-dynamic",
        "capacity-short",
        "capacity-enough",
        "capacity-elsewhere",
        "max-volume-size-wins",
        "driver-without-capacity-tracking",
        "selected-here",
        "selected-elsewhere",
    ],
)
def test_filter_dynamic(
    objs: list[tuple[str, Json]],
    labels: dict[str, str],
    reasons: tuple[str, ...],
    provisions: list[str],
) -> None:
    state = cluster(load(*objs), node("n1", **labels))
    plugin = VolumeBinding(state)
    cs = CycleState()
    p = pod("d")
    assert plugin.pre_filter(cs, p).ok
    st = plugin.filter(cs, p, state.nodes["n1"])
    assert st.reason == ", ".join(reasons)
    if not reasons:
        found = cs.read(volume_binding._CYCLE).by_node["n1"]  # type: ignore[union-attr]
        assert [c.name for c in found.provisions] == provisions


# --- Reserve / Unreserve: AssumePodVolumes, RevertAssumedPodVolumes and the assume cache
def two_pods_one_pv() -> tuple[ClusterState, VolumeBinding]:
    state = cluster(load(*delayed(pvc("a"), pvc("b")), *pvs(pv("pv1", node="n1"))))
    return state, VolumeBinding(state)


def placed(plugin: VolumeBinding, the_pod: Pod, state: ClusterState) -> tuple[CycleState, str]:
    cs = CycleState()
    assert plugin.pre_filter(cs, the_pod).ok
    st = plugin.filter(cs, the_pod, state.nodes["n1"])
    return cs, st.reason


def test_a_pv_reserved_for_one_pod_is_not_offered_to_another_until_unreserved() -> None:
    state, plugin = two_pods_one_pv()
    first, second = pod("a", uid="ua"), pod("b", uid="ub")
    cs_a, why = placed(plugin, first, state)
    assert why == ""
    assert plugin.reserve(cs_a, first, "n1").ok
    assumed = state.storage.volume("pv1")
    assert assumed is not None
    assert assumed.claim_ref is not None
    assert (assumed.claim_ref.name, assumed.claim_ref.uid) == ("a", "uid-a")
    assert state.storage.volumes["pv1"].claim_ref is None  # the apiserver's is untouched
    _, why = placed(plugin, second, state)
    assert why == BIND_CONFLICT
    plugin.unreserve(cs_a, first, "n1")
    assert state.storage.volume("pv1").claim_ref is None  # type: ignore[union-attr]
    _, why = placed(plugin, second, state)
    assert why == ""


def test_an_assumed_pv_gives_way_to_a_newer_version_only() -> None:
    state, plugin = two_pods_one_pv()
    first = pod("a", uid="ua")
    cs, _ = placed(plugin, first, state)
    plugin.reserve(cs, first, "n1")
    state.storage.apply("persistentvolumes", "MODIFIED", pv("pv1", node="n1", rv="1"))
    assert state.storage.is_assumed("persistentvolumes", "pv1")  # the same version: kept
    state.storage.apply("persistentvolumes", "MODIFIED", pv("pv1", node="n1", claim="a", rv="2"))
    assert not state.storage.is_assumed("persistentvolumes", "pv1")
    assert state.storage.volume("pv1").claim_ref.name == "a"  # type: ignore[union-attr]


def test_reserve_of_a_stale_view_fails_and_assumes_nothing() -> None:
    state, plugin = two_pods_one_pv()
    first = pod("a", uid="ua")
    cs, _ = placed(plugin, first, state)
    state.storage.apply("persistentvolumes", "MODIFIED", pv("pv1", node="n1", rv="7"))
    st = plugin.reserve(cs, first, "n1")
    assert not st.ok
    assert "out of sync" in st.reason
    assert not state.storage.is_assumed("persistentvolumes", "pv1")


def test_a_claim_reserved_for_provisioning_holds_its_node_for_a_pod_sharing_it() -> None:
    state = cluster(load(*claims(pvc("d", sc="fast")), *classes(FAST)))
    plugin = VolumeBinding(state)
    first, second = pod("d", uid="u1"), pod("d", uid="u2")
    cs, _ = placed(plugin, first, state)
    assert plugin.reserve(cs, first, "n1").ok
    assert state.storage.claim("ns", "d").selected_node == "n1"  # type: ignore[union-attr]
    cs2 = CycleState()
    assert plugin.pre_filter(cs2, second).ok
    assert plugin.filter(cs2, second, state.nodes["n2"]).reason == BIND_CONFLICT
    assert plugin.filter(cs2, second, state.nodes["n1"]).ok
    plugin.unreserve(cs, first, "n1")
    assert state.storage.claim("ns", "d").selected_node is None  # type: ignore[union-attr]


def test_a_pod_whose_claims_are_all_bound_writes_nothing() -> None:
    objs = claims(pvc("d", volume="pv1", bound=True)) + pvs(pv("pv1", claim="d"))
    state = cluster(load(*objs))
    plugin = VolumeBinding(state)
    cs, _ = placed(plugin, pod("d"), state)
    assert plugin.reserve(cs, pod("d"), "n1").ok
    assert cs.read(volume_binding._CYCLE).all_bound  # type: ignore[union-attr]


# --- PreBind: bindAPIUpdate, then checkBindings until bound or the bind timeout
class Writer:
    """The apiserver's answer to the PUTs: the object as sent with its next resourceVersion."""

    def __init__(self) -> None:
        self.volumes: list[Json] = []
        self.claims: list[Json] = []

    @staticmethod
    def _bump(raw: Json) -> Json:
        back = copy.deepcopy(raw)
        back["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 1)
        return back

    async def update_volume(self, raw: Json) -> Json:
        self.volumes.append(raw)
        return self._bump(raw)

    async def update_claim(self, raw: Json) -> Json:
        self.claims.append(raw)
        return self._bump(raw)

    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        raise AssertionError("PreBind never binds")


def reserved(
    objs: list[tuple[str, Json]],
    *,
    timeout: float = 600.0,
    clock: Callable[[], float] | None = None,
) -> tuple[ClusterState, VolumeBinding, CycleState, Pod]:
    state = cluster(load(*objs))
    plugin = VolumeBinding(state, timeout, clock or (lambda: 0.0))
    p = pod("d")
    cs, why = placed(plugin, p, state)
    assert why == ""
    assert plugin.reserve(cs, p, "n1").ok
    state.assume(p, "n1", None, float("inf"))  # as the scheduler does after Reserve
    return state, plugin, cs, p


def pv_controller_binds(state: ClusterState, rv: str = "3") -> None:
    """What kube-controller-manager's PV controller writes once the scheduler set claimRef."""
    state.storage.apply(
        "persistentvolumes", "MODIFIED", pv("pv1", node="n1", claim="d", rv=rv, phase="Bound")
    )
    state.storage.apply(
        "persistentvolumeclaims",
        "MODIFIED",
        pvc("d", volume="pv1", bound=True, rv="2", phase="Bound"),
    )


async def test_pre_bind_writes_the_claim_ref_then_waits_for_the_pv_controller() -> None:
    state, plugin, cs, p = reserved(delayed(pvc("d")) + pvs(pv("pv1", node="n1")))
    writer = Writer()
    waiting = asyncio.ensure_future(plugin.pre_bind(cs, p, "n1", writer))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()  # written, not bound yet
    (sent,) = writer.volumes
    ref = sent["spec"]["claimRef"]
    assert {k: ref[k] for k in ("kind", "namespace", "name", "uid", "apiVersion")} == {
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "d",
        "uid": "uid-d",
        "apiVersion": "v1",
    }
    assert sent["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"
    assert sent["metadata"]["resourceVersion"] == "1"  # a conflicting change is refused (409)
    assert writer.claims == []
    pv_controller_binds(state)
    st = await asyncio.wait_for(waiting, 5)  # woken by the watch event, not a timer
    assert st.ok, st.reason


async def test_pre_bind_waits_for_its_own_write_to_come_back_through_the_watch() -> None:
    state, plugin, cs, p = reserved(delayed(pvc("d")) + pvs(pv("pv1", node="n1")))
    waiting = asyncio.ensure_future(plugin.pre_bind(cs, p, "n1", Writer()))
    await asyncio.sleep(0)
    # an older event (version 1) of a PV showing a bound claim must not end the wait: the
    # write (version 2) has not been seen yet
    state.storage.apply(
        "persistentvolumeclaims", "MODIFIED", pvc("d", volume="pv1", bound=True, rv="2")
    )
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    pv_controller_binds(state, rv="2")
    assert (await asyncio.wait_for(waiting, 5)).ok


async def test_pre_bind_sets_the_selected_node_of_a_claim_to_provision() -> None:
    state, plugin, cs, p = reserved(claims(pvc("d", sc="fast")) + classes(FAST))
    writer = Writer()
    waiting = asyncio.ensure_future(plugin.pre_bind(cs, p, "n1", writer))
    await asyncio.sleep(0)
    (sent,) = writer.claims
    assert sent["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "n1"
    assert writer.volumes == []
    provisioned = pv("pvc-d", sc="fast", node="n1", claim="d", phase="Bound")
    state.storage.apply("persistentvolumes", "ADDED", provisioned)
    bound = pvc("d", sc="fast", volume="pvc-d", bound=True, selected="n1", rv="3")
    state.storage.apply("persistentvolumeclaims", "MODIFIED", bound)
    assert (await asyncio.wait_for(waiting, 5)).ok


def clock_after(*times: float) -> Callable[[], float]:
    """A clock that reads ``times`` in turn, then stays at the last."""
    seen = list(times)
    return lambda: seen.pop(0) if len(seen) > 1 else seen[0]


@pytest.mark.parametrize(
    ("undo", "reason"),
    [
        (
            lambda s: s.storage.apply(
                "persistentvolumes", "MODIFIED", pv("pv1", node="n1", rv="3")
            ),
            'binding volumes: ClaimRef got reset for pv "pv1"',
        ),
        (
            lambda s: s.remove_pod("pod-uid"),
            "binding volumes: pod does not exist any more",
        ),
        (
            lambda s: s.storage.stop(),
            "binding volumes: the scheduler is stopping",
        ),
        (
            lambda s: s.storage.apply(
                "persistentvolumes", "MODIFIED", pv("pv1", node="n2", claim="d", rv="3")
            ),
            'binding volumes: pv "pv1" node affinity doesn\'t match node "n1"',
        ),
    ],
    ids=["claim-ref-reset", "pod-deleted", "scheduler-stopping", "pv-moved"],
)
async def test_pre_bind_fails_when_the_binding_is_undone(
    undo: Callable[[ClusterState], None], reason: str
) -> None:
    state, plugin, cs, p = reserved(delayed(pvc("d")) + pvs(pv("pv1", node="n1")))
    waiting = asyncio.ensure_future(plugin.pre_bind(cs, p, "n1", Writer()))
    await asyncio.sleep(0)
    undo(state)
    st = await asyncio.wait_for(waiting, 5)
    assert not st.ok
    assert st.reason == reason


async def test_pre_bind_fails_when_the_provisioner_gives_the_node_back() -> None:
    state, plugin, cs, p = reserved(claims(pvc("d", sc="fast")) + classes(FAST))
    waiting = asyncio.ensure_future(plugin.pre_bind(cs, p, "n1", Writer()))
    await asyncio.sleep(0)
    state.storage.apply("persistentvolumeclaims", "MODIFIED", pvc("d", sc="fast", rv="3"))
    st = await asyncio.wait_for(waiting, 5)
    assert st.reason == 'binding volumes: provisioning failed for PVC "d"'


async def test_pre_bind_gives_up_after_the_bind_timeout() -> None:
    # the clock jumps past the deadline on its second reading: no real waiting
    state, plugin, cs, p = reserved(
        delayed(pvc("d")) + pvs(pv("pv1", node="n1")), timeout=600, clock=clock_after(0.0, 601.0)
    )
    st = await asyncio.wait_for(plugin.pre_bind(cs, p, "n1", Writer()), 5)
    assert st.reason == "binding volumes: the PV controller did not bind ns/d within 600 s"
    plugin.unreserve(cs, p, "n1")
    assert not state.storage.is_assumed("persistentvolumes", "pv1")


async def test_pre_bind_of_a_pod_with_bound_claims_does_nothing() -> None:
    objs = claims(pvc("d", volume="pv1", bound=True)) + pvs(pv("pv1", claim="d"))
    _state, plugin, cs, p = reserved(objs)
    writer = Writer()
    assert (await plugin.pre_bind(cs, p, "n1", writer)).ok
    assert writer.volumes == writer.claims == []


def test_check_is_the_pv_controller_s_completion() -> None:
    """checkBindings: a claim is done once it names its volume and carries bind-completed."""
    s = load(*delayed(pvc("d", volume="pv1", rv="2")), *pvs(pv("pv1", claim="d", rv="2")))
    written = volume_binder.PodVolumes(
        (volume_binder.Binding(s.claims["ns/d"], s.volumes["pv1"]),), ()
    )
    assert not volume_binder.check(written, "n1", {}, s)
    s.apply("persistentvolumeclaims", "MODIFIED", pvc("d", volume="pv1", bound=True, rv="3"))
    assert volume_binder.check(written, "n1", {}, s)
