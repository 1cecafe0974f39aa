"""Upstream PodGroups (``scheduling.k8s.io/v1beta1``, the pod's ``spec.schedulingGroup``)
through the feed and the loop, over a fake apiserver edge that answers as the apiserver does:
a gang policy placed all or nothing (at least ``minCount``) packed into one topology domain,
a basic policy one by one, preemption treating a gang as a unit, the PodGroup's condition."""

from __future__ import annotations

import time
from typing import Any, cast

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.model import Device, Pod, PodGroup
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.scheduler import Scheduler
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState

GPU = "aliyun.com/gpu"
BLOCK = "network.topology/block"


class World:
    """A small cluster's state, queue and scheduler; an edge recording what the scheduler wrote
    and feeding it back as the watches would."""

    def __init__(self, nodes: dict[str, tuple[str, int]]) -> None:
        """``nodes``: name → (block, GPUs)."""
        self.now = time.monotonic()
        self.state = ClusterState()
        for name, (block, gpus) in nodes.items():
            self.state.set_node(_node(name, block, gpus))
            devices = tuple(Device(f"gpu-{i}", "GPU", 80, True, 0, 0, i) for i in range(gpus))
            self.state.set_devices(name, devices)
        cfg = Settings(leader_elect=False)
        metrics = Metrics()
        self.sched = Scheduler(
            cfg,
            state=self.state,
            queue=SchedulingQueue(),
            profile=build_profile(cfg, self.state, metrics),
            binder=cast(Any, self),
            recorder=cast(Any, self),
            metrics=metrics,
            evictor=cast(Any, self),
            groups=cast(Any, self),
            clock=lambda: self.now,
        )
        self.feed = Informers(cast(Any, None), cfg, self.state, self.sched.queue, self.sched.poke)
        self.raw: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.bound: dict[str, str] = {}
        self.preempted: list[str] = []
        self.conditions: list[tuple[str, bool, str, str]] = []

    # -- the apiserver side
    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        raw = self.raw[pod.name]
        raw["spec"]["nodeName"] = node
        raw["metadata"]["annotations"].update(annotations)
        raw["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
        self.bound[pod.name] = node
        self.feed._handle("pods", "MODIFIED", raw)

    async def nominate(self, pod: Pod, node: str | None) -> None:
        self.raw[pod.name].setdefault("status", {})["nominatedNodeName"] = node
        self.feed._handle("pods", "MODIFIED", self.raw[pod.name])

    async def preempt(self, victim: Pod, by: Pod) -> None:
        self.preempted.append(victim.name)
        self.raw[victim.name]["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
        self.feed._handle("pods", "MODIFIED", self.raw[victim.name])

    async def pod_group_condition(
        self, group: PodGroup, scheduled: bool, reason: str, message: str
    ) -> None:
        self.conditions.append((group.name, scheduled, reason, message))

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))

    # -- what a test does
    def group(self, name: str, min_count: int = 0, **spec: Any) -> None:
        """A PodGroup: gang with ``min_count`` (0: basic)."""
        policy = {"gang": {"minCount": min_count}} if min_count else {"basic": {}}
        obj = {
            "metadata": {"name": name, "namespace": "ns", "uid": f"pg-{name}"},
            "spec": {"schedulingPolicy": policy, **spec},
        }
        self.feed._handle("podgroups", "ADDED", obj)

    def pod(self, name: str, gpus: int, group: str = "", priority: int = 0, node: str = "") -> str:
        spec: dict[str, Any] = {
            "schedulerName": "lj-runtimekit-scheduler",
            "priority": priority,
            "containers": [
                {"name": "main", "resources": {"limits": {GPU: str(gpus)}, "requests": {}}}
            ],
        }
        if group:
            spec["schedulingGroup"] = {"podGroupName": group}
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        self.raw[name] = {
            "metadata": {"uid": f"uid-{name}", "name": name, "namespace": "ns", "annotations": {}},
            "spec": spec,
            "status": {"phase": "Pending"},
        }
        self.feed._handle("pods", "ADDED", self.raw[name])
        return name

    async def settle(self) -> None:
        for _ in range(60):
            self.now += 11  # past any backoff (10 s at most), short of the 60 s retry
            self.sched.queue.flush(self.now)
            pod = self.sched.queue.pop(self.now)
            if pod is None:
                return
            self.sched.schedule(pod)
            await self.sched.drain()

    def said(self, name: str) -> list[str]:
        return [m for p, r, m in self.events if p == name and r == "FailedScheduling"]


def _node(name: str, block: str, gpus: int) -> Any:
    return objects.node(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "lj_runtimekit_enable": "true",
                    "kubernetes.io/hostname": name,
                    BLOCK: block,
                },
            },
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", GPU: str(gpus)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


async def test_a_gang_pod_group_waits_for_its_object_then_lands_whole_in_one_block() -> None:
    w = World({"a1": ("A", 8), "a2": ("A", 8), "b1": ("B", 8)})
    for i in range(4):
        w.pod(f"g{i}", 4, group="train")
    await w.settle()
    assert w.bound == {}
    assert any("waiting for PodGroup ns/train" in m for m in w.said("g0"))
    w.group("train", min_count=4)  # its arrival unparks the pods at once
    await w.settle()
    assert sorted(w.bound) == ["g0", "g1", "g2", "g3"]
    assert set(w.bound.values()) == {"a1", "a2"}  # block A holds all four; B alone could not
    assert w.conditions == [("train", True, "Scheduled", "")]


async def test_a_gang_pod_group_short_of_min_count_holds_nothing() -> None:
    w = World({"a1": ("A", 8)})
    w.group("train", min_count=3)
    w.pod("g0", 1, group="train")
    w.pod("g1", 1, group="train")
    await w.settle()
    assert w.bound == {}
    assert any("waiting for 1 more of 3" in m for m in w.said("g0") + w.said("g1"))
    assert w.state.pods == {}


async def test_a_gang_pod_group_that_cannot_fit_whole_stays_pending_and_says_why() -> None:
    w = World({"a1": ("A", 8), "b1": ("B", 8)})
    w.group("big", min_count=3)
    for i in range(3):
        w.pod(f"g{i}", 8, group="big")  # three whole nodes wanted, two exist
    await w.settle()
    assert w.bound == {}
    assert w.state.pods == {}  # nothing held either
    for i in range(3):
        assert any("minCount (3) cannot be satisfied" in m for m in w.said(f"g{i}"))
    assert [(n, ok, r) for n, ok, r, _ in w.conditions] == [("big", False, "Unschedulable")]
    assert "minCount (3) cannot be satisfied" in w.conditions[0][3]


async def test_pods_beyond_min_count_that_do_not_fit_wait_while_min_count_binds() -> None:
    w = World({"a1": ("A", 8), "b1": ("B", 8)})
    w.group("elastic", min_count=2)
    for i in range(3):
        w.pod(f"g{i}", 8, group="elastic")
    await w.settle()
    assert len(w.bound) == 2
    (left,) = {"g0", "g1", "g2"} - set(w.bound)
    assert any("2 of its pods are placed (minCount 2)" in m for m in w.said(left))
    assert w.conditions == [("elastic", True, "Scheduled", "")]


async def test_a_basic_pod_group_is_placed_one_by_one() -> None:
    w = World({"a1": ("A", 8), "b1": ("B", 8)})
    w.group("svc")
    for i in range(3):
        w.pod(f"s{i}", 8, group="svc")
    await w.settle()
    assert len(w.bound) == 2  # as many as fit, no all-or-nothing
    assert ("svc", True, "Scheduled", "") in w.conditions


async def test_a_pod_group_s_topology_constraint_keeps_it_in_one_domain_of_that_label() -> None:
    w = World({"a1": ("A", 8), "a2": ("A", 8), "b1": ("B", 8), "b2": ("B", 8)})
    w.pod("pin", 8, node="a1")  # block A has room for one 8-GPU pod only
    await w.settle()
    w.group("rack", min_count=2, schedulingConstraints={"topology": [{"key": BLOCK}]})
    w.pod("r0", 8, group="rack")
    w.pod("r1", 8, group="rack")
    await w.settle()
    assert {w.bound["r0"], w.bound["r1"]} == {"b1", "b2"}


async def test_a_gang_pod_group_member_is_never_a_victim_alone() -> None:
    w = World({"n1": ("A", 8), "n2": ("B", 8)})
    w.group("lo", min_count=2)
    w.pod("g0", 4, group="lo", priority=1, node="n1")
    w.pod("g1", 4, group="lo", priority=1, node="n2")
    w.pod("keep1", 4, priority=50, node="n1")
    w.pod("keep2", 4, priority=50, node="n2")
    await w.settle()
    assert len(w.bound) == 4
    w.pod("high", 4, priority=10)
    await w.settle()
    assert sorted(w.preempted) == ["g0", "g1"]


async def test_a_basic_pod_group_member_is_preempted_alone() -> None:
    w = World({"n1": ("A", 8), "n2": ("B", 8)})
    w.group("svc")
    w.pod("s0", 4, group="svc", priority=1, node="n1")
    w.pod("s1", 4, group="svc", priority=1, node="n2")
    w.pod("keep1", 4, priority=50, node="n1")
    w.pod("keep2", 4, priority=50, node="n2")
    await w.settle()
    w.pod("high", 4, priority=10)
    await w.settle()
    assert len(w.preempted) == 1


async def test_annotation_gangs_are_untouched_by_pod_groups() -> None:
    w = World({"a1": ("A", 8), "a2": ("A", 8)})
    w.group("g", min_count=1)  # same name as the annotation gang: not the same gang
    for i in range(2):
        name = w.pod(f"a{i}", 8)
        ann = {
            "lj-runtimekit-scheduler/pod-group": "g",
            "lj-runtimekit-scheduler/pod-group-size": "3",
        }
        w.raw[name]["metadata"]["annotations"] = ann
        w.feed._handle("pods", "MODIFIED", w.raw[name])
    await w.settle()
    assert w.bound == {}
    assert any("waiting for 1 more of 3" in m for m in w.said("a0") + w.said("a1"))


async def test_a_pod_group_in_a_composite_group_is_refused_saying_why() -> None:
    w = World({"a1": ("A", 8)})
    w.group("part", min_count=1, parentCompositePodGroupName="whole")
    w.pod("p0", 1, group="part")
    await w.settle()
    assert w.bound == {}
    assert any("CompositePodGroup whole" in m for m in w.said("p0"))


async def test_a_raised_min_count_is_read_and_a_deleted_pod_group_is_waited_for_again() -> None:
    w = World({"a1": ("A", 8)})
    w.group("g", min_count=2)
    w.group("g", min_count=3)  # MODIFIED: the latest minCount applies
    assert w.state.pod_groups["ns/g"].min_count == 3
    w.pod("g0", 1, group="g")
    w.pod("g1", 1, group="g")
    await w.settle()
    assert w.bound == {}
    assert any("waiting for 1 more of 3" in m for m in w.said("g0") + w.said("g1"))
    w.feed._handle("podgroups", "DELETED", {"metadata": {"name": "g", "namespace": "ns"}})
    w.sched.queue.cluster_changed(w.now)
    await w.settle()
    assert any("waiting for PodGroup ns/g" in m for m in w.said("g0") + w.said("g1"))
    w.feed._handle("podgroups", "ADDED", {"metadata": {"name": "bad"}, "spec": {}})
    assert "default/bad" not in w.state.pod_groups  # malformed: logged and skipped
