"""Pods with claims through the whole loop: the storage informers, the framework's PreFilter
narrowing and memo, the scheduler's Reserve → PreBind → Bind against a fake apiserver edge
that plays the PV controller, and the storage objects as parsed from the apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_scheduler import objects, storage, volumes
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.framework import CycleState
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.model import Disk, Pod, PodVolume
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.scheduler import Scheduler
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState

Json = dict[str, Any]


def node(name: str, cpu: str = "8") -> Json:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def local_pv(name: str, on: str, rv: str = "1", claim: str | None = None) -> Json:
    spec: Json = {
        "capacity": {"storage": "10Gi"},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local",
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [on]}
                        ]
                    }
                ]
            }
        },
    }
    if claim:
        spec["claimRef"] = {"namespace": "ns", "name": claim, "uid": f"uid-{claim}"}
    # Available: what the PV controller makes of a new PV (it is Pending until then)
    status = {"phase": "Bound" if claim else "Available"}
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": spec, "status": status}


def claim(name: str, rv: str = "1", volume: str = "", bound: bool = False) -> Json:
    ann = {"pv.kubernetes.io/bind-completed": "yes"} if bound else {}
    spec: Json = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local",
        "resources": {"requests": {"storage": "5Gi"}},
    }
    if volume:
        spec["volumeName"] = volume
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv}
    return {"metadata": {**meta, "annotations": ann}, "spec": spec, "status": {}}


LOCAL_CLASS = {
    "metadata": {"name": "local"},
    "provisioner": "kubernetes.io/no-provisioner",
    "volumeBindingMode": "WaitForFirstConsumer",
}


def pod(name: str, claim_name: str, cpu: str = "1") -> Pod:
    return objects.pod(
        {
            "metadata": {"uid": f"uid-{name}", "name": name, "namespace": "ns"},
            "spec": {
                "schedulerName": "lj-runtimekit-scheduler",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
            },
        }
    )


class Apiserver:
    """Bindings, Events and the volume writes, with kube-controller-manager's PV controller
    answering a claimRef the way it does: the PV Bound, the claim naming it, bind-completed."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.bound: dict[str, str] = {}
        self.writes: list[str] = []
        self.events: list[tuple[str, str, str]] = []

    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        self.writes.append(f"bind {pod.name}")
        self.bound[pod.name] = node

    async def update_volume(self, raw: Json) -> Json:
        back = copy.deepcopy(raw)
        back["metadata"]["resourceVersion"] = "2"
        self.writes.append(f"pv {raw['metadata']['name']}")
        ref = raw["spec"]["claimRef"]

        def pv_controller() -> None:
            done = copy.deepcopy(back)
            done["metadata"]["resourceVersion"] = "3"
            done["status"] = {"phase": "Bound"}
            self.state.storage.apply("persistentvolumes", "MODIFIED", done)
            bound = claim(ref["name"], rv="2", volume=raw["metadata"]["name"], bound=True)
            self.state.storage.apply("persistentvolumeclaims", "MODIFIED", bound)

        asyncio.get_running_loop().call_soon(pv_controller)
        return back

    async def update_claim(self, raw: Json) -> Json:
        raise AssertionError("nothing to provision here")

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))


def setup(*nodes: Json) -> tuple[Scheduler, Apiserver, ClusterState]:
    state = ClusterState()
    for kind in storage.KINDS:
        state.storage.relist(kind, [])
    state.storage.apply("storageclasses", "ADDED", LOCAL_CLASS)
    for n in nodes:
        state.set_node(objects.node(n))
    edge = Apiserver(state)
    cfg = Settings(leader_elect=False)
    metrics = Metrics()
    sched = Scheduler(
        cfg,
        state=state,
        queue=SchedulingQueue(),
        profile=build_profile(cfg, state, metrics),
        binder=edge,
        recorder=edge,
        metrics=metrics,
    )
    return sched, edge, state


async def run_until_idle(sched: Scheduler) -> None:
    while (p := sched.queue.pop(sched.clock())) is not None:
        sched.schedule(p)
        await asyncio.wait_for(sched.drain(), 10)


async def test_a_wait_for_first_consumer_claim_lands_its_pod_on_the_pv_s_node() -> None:
    sched, edge, state = setup(node("n1"), node("n2"), node("n3"))
    state.storage.apply("persistentvolumes", "ADDED", local_pv("pv1", on="n2"))
    state.storage.apply("persistentvolumeclaims", "ADDED", claim("data"))
    sched.queue.add(pod("p", "data"), 0)
    await run_until_idle(sched)
    assert edge.bound == {"p": "n2"}
    assert edge.writes == ["pv pv1", "bind p"]  # the claimRef before the Binding
    assert state.storage.claims["ns/data"].fully_bound


async def test_two_pods_in_flight_never_get_one_pv() -> None:
    sched, edge, state = setup(node("n1"), node("n2"))
    state.storage.apply("persistentvolumes", "ADDED", local_pv("pv1", on="n1"))
    for c in ("a", "b"):
        state.storage.apply("persistentvolumeclaims", "ADDED", claim(c))
    sched.queue.add(pod("pa", "a"), 0)
    sched.queue.add(pod("pb", "b"), 0)
    first = sched.queue.pop(0)
    second = sched.queue.pop(0)
    assert first is not None
    assert second is not None
    sched.schedule(first)  # its PreBind runs in the background: pv1 is only assumed yet
    sched.schedule(second)
    await asyncio.wait_for(sched.drain(), 10)
    assert edge.bound == {first.name: "n1"}
    (failed,) = [e for e in edge.events if e[1] == "FailedScheduling"]
    assert failed[0] == second.name
    assert failed[2] == (
        "0/2 nodes are available: 2 VolumeBinding: node(s) didn't find available persistent "
        "volumes to bind. preemption: 0/2 nodes are available: 2 Preemption is not helpful for "
        "scheduling."
    )


async def test_nodes_a_bound_local_pv_rules_out_are_not_evaluated() -> None:
    """GetEligibleNodes → PreFilterResult: the other nodes get kube-scheduler's words."""
    sched, _edge, state = setup(node("n1"), node("n2", cpu="1"), node("n3"))
    state.storage.apply("persistentvolumes", "ADDED", local_pv("pv1", on="n2", claim="data"))
    state.storage.apply("persistentvolumeclaims", "ADDED", claim("data", volume="pv1", bound=True))
    result = sched.profile.find_node(CycleState(), pod("p", "data", cpu="2"), state)
    assert result.node is None
    assert result.reasons == {
        "n1": "VolumeBinding: node(s) didn't satisfy plugin(s) [VolumeBinding]",
        "n2": "NodeResourcesFit: Insufficient cpu",
        "n3": "VolumeBinding: node(s) didn't satisfy plugin(s) [VolumeBinding]",
    }
    fits = sched.profile.find_node(CycleState(), pod("p", "data", cpu="1"), state)
    assert fits.node == "n2"


async def test_a_claim_pod_s_verdict_is_not_remembered_across_pv_changes() -> None:
    sched, _, state = setup(node("n1"))
    state.storage.apply("persistentvolumeclaims", "ADDED", claim("data"))
    assert sched.profile.find_node(CycleState(), pod("p", "data"), state).node is None
    # nothing of the node changed, only a PV appeared: the same pod shape must see it
    state.storage.apply("persistentvolumes", "ADDED", local_pv("pv1", on="n1"))
    assert sched.profile.find_node(CycleState(), pod("p", "data"), state).node == "n1"


class NoKube:
    pass


async def test_storage_events_reach_the_cache_and_move_parked_pods() -> None:
    state = ClusterState()
    queue = SchedulingQueue()
    pokes: list[int] = []
    feed = Informers(
        cast(Any, NoKube()), Settings(leader_elect=False), state, queue, lambda: pokes.append(1)
    )
    queue.add(pod("p", "data"), 0)
    parked = queue.pop(0)
    assert parked is not None
    queue.failed(parked.uid, 0, unschedulable=True)
    assert queue.depth()["unschedulable"] == 1
    feed._relist("persistentvolumes", [])
    feed._handle("persistentvolumes", "ADDED", local_pv("pv1", on="n1"))
    assert "pv1" in state.storage.volumes
    assert queue.depth()["unschedulable"] == 0
    # a relist drops what the apiserver no longer has
    feed._relist("persistentvolumes", [])
    assert state.storage.volumes == {}
    # a malformed object is skipped, never fatal
    feed._handle("persistentvolumeclaims", "ADDED", {"metadata": {"name": "x"}, "spec": 7})
    assert state.storage.claims == {}


def test_claim_pods_are_no_longer_refused_and_their_volumes_are_read() -> None:
    raw = {
        "metadata": {"uid": "u", "name": "train"},
        "spec": {
            "containers": [],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "pd", "gcePersistentDisk": {"pdName": "disk-1", "readOnly": True}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }
    p = objects.pod(raw)
    assert p.unsupported == ()
    assert p.volumes == (
        PodVolume("data", claim="dataset"),
        PodVolume("scratch", claim="train-scratch", ephemeral=True),
        PodVolume("pd", disk=Disk("gce-pd", "disk-1", read_only=True)),
    )
    assert [v.name for v in p.claims] == ["data", "scratch"]


def test_storage_objects_read_as_the_apiserver_defaults_them() -> None:
    c = volumes.claim(
        {
            "metadata": {
                "name": "d",
                "namespace": "ns",
                "uid": "u",
                "annotations": {"volume.beta.kubernetes.io/storage-class": "beta"},
            },
            "spec": {"storageClassName": "ignored", "resources": {"requests": {"storage": "1Gi"}}},
        }
    )
    assert (c.storage_class, c.request, c.volume_mode, c.selector) == (
        "beta",
        2**30,
        "Filesystem",
        None,
    )
    sc = volumes.storage_class({"metadata": {"name": "s"}, "provisioner": "x"})
    assert sc.binding_mode == "Immediate"
    assert sc.allows({})  # no allowedTopologies: every node
    empty = volumes.Selector()
    assert empty.matches({"any": "thing"})  # an empty selector selects everything


GARBAGE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(GARBAGE)
def test_storage_parsers_only_refuse_garbage_with_the_errors_the_feed_skips(raw: Any) -> None:
    for kind in storage.KINDS:
        s = storage.Storage()
        obj = raw if isinstance(raw, dict) else {"metadata": raw}
        with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError, ArithmeticError):
            s.apply(kind, "ADDED", obj)
