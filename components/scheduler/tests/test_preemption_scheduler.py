"""Preemption through the scheduling loop and the feed, over a fake apiserver edge that answers
as the apiserver does: victims chosen on the right node (priority, budgets, GPUs, gangs), the
preemptor nominated and its room held while the victims terminate, then bound there."""

from __future__ import annotations

import json
import time
from typing import Any, cast

from lj_runtimekit_scheduler import storage
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.model import ASSIGNMENT_ANNOTATION, Device, Pod
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.scheduler import Scheduler
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState

GPU, CORE = "aliyun.com/gpu", "aliyun.com/gpu-core"
HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
GROUP, SIZE = "lj-runtimekit-scheduler/pod-group", "lj-runtimekit-scheduler/pod-group-size"


class World:
    """The state, queue and scheduler of a small cluster, its pods as the apiserver holds them,
    and an edge recording what the scheduler wrote (and feeding it back as the watch would)."""

    def __init__(
        self,
        nodes: dict[str, tuple[int, int]],
        islands: int = 1,
        zones: dict[str, str] | None = None,
    ) -> None:
        """``nodes``: name → (cpu cores, GPUs); ``zones``: name → its zone label."""
        self.now = time.monotonic()  # the feed stamps the queue with the monotonic clock
        self.state = ClusterState()
        for kind in storage.KINDS:
            self.state.storage.relist(kind, [])
        for name, (cpu, gpus) in nodes.items():
            self.state.set_node(_node(name, cpu, gpus, (zones or {}).get(name)))
            per = max(1, gpus // islands)
            devices = tuple(
                Device(f"gpu-{i}", "GPU", 80, True, i // per, i // per, i) for i in range(gpus)
            )
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
            clock=lambda: self.now,
        )
        self.feed = Informers(cast(Any, None), cfg, self.state, self.sched.queue, self.sched.poke)
        self.raw: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.nominations: list[tuple[str, str | None]] = []
        self.preempted: list[tuple[str, str]] = []
        self.bound: dict[str, str] = {}
        self.started = 0

    # -- the apiserver side (Binder, Evictor, Recorder)
    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        raw = self.raw[pod.name]
        raw["spec"]["nodeName"] = node
        raw["metadata"]["annotations"].update(annotations)
        self.started += 1
        raw["status"] = {"phase": "Running", "startTime": f"2026-01-01T00:{self.started:02d}:00Z"}
        self.bound[pod.name] = node
        self.feed._handle("pods", "MODIFIED", raw)

    async def nominate(self, pod: Pod, node: str | None) -> None:
        self.nominations.append((pod.name, node))
        raw = self.raw[pod.name]
        raw.setdefault("status", {})["nominatedNodeName"] = node
        self.feed._handle("pods", "MODIFIED", raw)

    async def preempt(self, victim: Pod, by: Pod) -> None:
        self.preempted.append((victim.name, by.name))
        raw = self.raw[victim.name]
        raw["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
        }
        raw["status"].setdefault("conditions", []).append(condition)
        self.feed._handle("pods", "MODIFIED", raw)

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))

    # -- what a test does
    def pod(
        self,
        name: str,
        limits: dict[str, str],
        priority: int = 0,
        *,
        node: str = "",
        policy: str = "",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        spec_extra: dict[str, Any] | None = None,
    ) -> str:
        spec: dict[str, Any] = {
            "schedulerName": "lj-runtimekit-scheduler",
            "priority": priority,
            "containers": [{"name": "main", "resources": {"requests": limits, "limits": limits}}],
            **(spec_extra or {}),
        }
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        if policy:
            spec["preemptionPolicy"] = policy
        self.raw[name] = {
            "metadata": {
                "uid": f"uid-{name}",
                "name": name,
                "namespace": "ns",
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }
        self.feed._handle("pods", "ADDED", self.raw[name])
        return name

    def gone(self, *names: str) -> None:
        """The victims' graceful deletion ends: the apiserver deletes them."""
        for n in names:
            self.feed._handle("pods", "DELETED", self.raw.pop(n))

    def budget(self, name: str, allowed: int, **labels: str) -> None:
        obj = {
            "metadata": {"name": name, "namespace": "ns", "uid": f"pdb-{name}"},
            "spec": {"selector": {"matchLabels": labels}},
            "status": {"disruptionsAllowed": allowed},
        }
        self.feed._handle("poddisruptionbudgets", "ADDED", obj)

    async def settle(self) -> None:
        """Run every pod that may run now, as often as the queue offers one."""
        for _ in range(50):
            self.now += 11  # past any backoff (10 s at most), short of the 60 s retry
            self.sched.queue.flush(self.now)
            pod = self.sched.queue.pop(self.now)
            if pod is None:
                return
            self.sched.schedule(pod)
            await self.sched.drain()

    def said(self, name: str, reason: str = "FailedScheduling") -> list[str]:
        return [m for p, r, m in self.events if p == name and r == reason]

    def gpus_of(self, name: str) -> list[str]:
        doc = json.loads(self.raw[name]["metadata"]["annotations"][ASSIGNMENT_ANNOTATION])
        return [d["id"] for c in doc["containers"] for d in c["devices"]]


def _node(name: str, cpu: int, gpus: int, zone: str | None = None) -> Any:
    from lj_runtimekit_scheduler import objects

    labels = {"lj_runtimekit_enable": "true", "kubernetes.io/hostname": name}
    if zone is not None:
        labels[ZONE] = zone
    return objects.node(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": {
                    "cpu": str(cpu),
                    "memory": "64Gi",
                    "pods": "110",
                    GPU: str(gpus),
                    CORE: str(100 * gpus),
                    "aliyun.com/gpu-memory": str(80 * gpus),
                },
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


async def test_a_high_priority_pod_evicts_the_least_it_needs_then_binds_where_nominated() -> None:
    w = World({"n1": (4, 0)})
    for name, prio in (("low", 1), ("mid", 5)):
        w.pod(name, {"cpu": "2"}, prio)
    await w.settle()
    assert w.bound == {"low": "n1", "mid": "n1"}
    w.pod("high", {"cpu": "2"}, 10)
    await w.settle()
    assert w.preempted == [("low", "high")]
    assert w.nominations == [("high", "n1")]
    assert w.state.nominated["uid-high"].node == "n1"
    assert w.said("low", "Preempted") == ["Preempted by pod uid-high on node n1"]
    # kube-scheduler's FailedScheduling after a preemption: the filters' reasons alone
    assert w.said("high")[0] == "0/1 nodes are available: 1 NodeResourcesFit: Insufficient cpu."
    # while the victim terminates the pod waits: no second preemption, the nomination stays
    w.sched.queue.cluster_changed(w.now)
    await w.settle()
    assert w.preempted == [("low", "high")]
    assert w.said("high")[-1].endswith(
        "preemption: not eligible due to a terminating pod on the nominated node."
    )
    assert "uid-high" in w.state.nominated
    w.gone("low")
    await w.settle()
    assert w.bound["high"] == "n1"
    assert "uid-high" not in w.state.nominated
    assert w.sched.metrics.registry.get_sample_value("lj_scheduler_preemption_attempts_total") == 1


async def test_the_node_whose_victims_matter_least_is_chosen() -> None:
    w = World({"n1": (2, 0), "n2": (2, 0), "n3": (2, 0)})
    w.pod("a", {"cpu": "2"}, 5, node="n1")
    w.pod("b1", {"cpu": "1"}, 1, node="n2")
    w.pod("b2", {"cpu": "1"}, 1, node="n2")
    w.pod("c", {"cpu": "2"}, 1, node="n3", labels={"app": "db"})
    w.budget("db", 0, app="db")
    await w.settle()
    w.pod("high", {"cpu": "2"}, 10)
    await w.settle()
    # n3 (one victim of priority 1) would be the least harm, but it breaks a budget; n1's
    # victim has priority 5; n2's highest is 1, with two victims
    assert sorted(v for v, _ in w.preempted) == ["b1", "b2"]
    assert w.nominations == [("high", "n2")]


async def test_no_victims_and_nodes_it_cannot_use_are_said_in_kube_scheduler_s_words() -> None:
    w = World({"n1": (2, 0), "n2": (2, 0)})
    w.pod("peer", {"cpu": "2"}, 10, node="n1")
    await w.settle()
    w.pod("high", {"cpu": "2"}, 10, node="n1")
    await w.settle()
    assert w.preempted == []
    (msg,) = w.said("high")
    assert msg.startswith("0/2 nodes are available: ")
    assert msg.endswith(
        " preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
        "1 Preemption is not helpful for scheduling."
    )


async def test_preemption_policy_never_waits_and_evicts_nothing() -> None:
    w = World({"n1": (2, 0)})
    w.pod("low", {"cpu": "2"}, 1)
    await w.settle()
    w.pod("polite", {"cpu": "2"}, 10, policy="Never")
    await w.settle()
    assert w.preempted == []
    assert w.nominations == []
    assert w.said("polite")[-1].endswith("preemption: not eligible due to preemptionPolicy=Never.")


async def test_a_whole_gpu_is_freed_by_evicting_the_pod_on_it_not_shares_on_another() -> None:
    w = World({"n1": (32, 2)})
    w.pod("c", {CORE: "60"}, 1)  # first: gpu-0, and started earliest (the most important)
    await w.settle()
    w.pod("a", {CORE: "50"}, 1)
    w.pod("b", {CORE: "50"}, 1)
    await w.settle()
    assert (w.gpus_of("c"), w.gpus_of("a"), w.gpus_of("b")) == (["gpu-0"], ["gpu-1"], ["gpu-1"])
    w.pod("whole", {GPU: "1"}, 10)
    await w.settle()
    assert w.preempted == [("c", "whole")]  # kube-scheduler's order alone would evict a and b
    assert w.state.nominated["uid-whole"].choice is not None
    w.gone("c")
    await w.settle()
    assert w.bound["whole"] == "n1"
    assert w.gpus_of("whole") == ["gpu-0"]


async def test_the_room_freed_is_held_for_the_nominated_pod_against_equal_and_lower_ones() -> None:
    w = World({"n1": (32, 2)})
    w.pod("victim", {GPU: "1"}, 1)
    w.pod("keeper", {GPU: "1"}, 50)
    await w.settle()
    w.pod("high", {GPU: "1"}, 10)
    await w.settle()
    assert w.preempted == [("victim", "high")]
    held = w.gpus_of("victim")
    w.gone("victim", "keeper")  # both GPUs idle now; one is held for high
    for name, prio in (("lower", 1), ("equal", 10)):
        w.pod(name, {GPU: "1"}, prio, policy="Never")  # waiting, not evicting ``lower``
        pod = w.sched.queue.get(f"uid-{name}")
        assert pod is not None
        w.sched.schedule(pod)  # before high's own retry
        await w.sched.drain()
    assert w.bound["lower"] == "n1"
    assert w.gpus_of("lower") != held  # it got the other GPU
    assert "equal" not in w.bound  # equal priority does not take the held one either
    await w.settle()
    assert w.bound["high"] == "n1"
    assert w.gpus_of("high") == held


async def test_a_higher_priority_pod_may_take_the_room_held_for_a_nominated_one() -> None:
    w = World({"n1": (2, 0)})
    w.pod("victim", {"cpu": "2"}, 1)
    await w.settle()
    w.pod("high", {"cpu": "2"}, 10)
    await w.settle()
    w.gone("victim")
    w.pod("higher", {"cpu": "2"}, 20)
    higher = w.sched.queue.get("uid-higher")
    assert higher is not None
    w.sched.schedule(higher)
    await w.sched.drain()
    assert w.bound["higher"] == "n1"


async def test_a_nomination_read_from_the_pod_after_a_restart_holds_its_requests() -> None:
    w = World({"n1": (2, 0)})
    w.pod("before", {"cpu": "2"}, 10)  # already nominated by the scheduler that ran before
    w.raw["before"]["status"]["nominatedNodeName"] = "n1"
    w.sched.queue.delete("uid-before")
    w.feed._handle("pods", "MODIFIED", w.raw["before"])
    assert w.state.nominated["uid-before"].node == "n1"
    w.pod("small", {"cpu": "1"}, 1)
    small = w.sched.queue.get("uid-small")
    assert small is not None
    w.sched.schedule(small)
    await w.sched.drain()
    assert "small" not in w.bound


async def test_a_gang_member_is_never_a_victim_alone() -> None:
    w = World({"n1": (64, 8), "n2": (64, 8)})
    gang = {GROUP: "lo", SIZE: "2"}
    w.pod("g0", {GPU: "4"}, 1, node="n1", annotations=gang)
    w.pod("g1", {GPU: "4"}, 1, node="n2", annotations=gang)
    w.pod("keep-n1", {GPU: "4"}, 50, node="n1")
    w.pod("keep-n2", {GPU: "4"}, 50, node="n2")
    await w.settle()
    assert len(w.bound) == 4
    w.pod("high", {GPU: "4"}, 10)
    await w.settle()
    # only the gang's member can go on either node: then its whole gang goes, both nodes
    assert sorted(v for v, _ in w.preempted) == ["g0", "g1"]
    evicted_on = {m.split(" on node ")[1] for p, r, m in w.events if r == "Preempted"}
    assert evicted_on == {"n1", "n2"}


async def test_a_lone_pod_is_evicted_rather_than_a_whole_gang() -> None:
    w = World({"n1": (64, 8), "n2": (64, 8)})
    gang = {GROUP: "lo", SIZE: "2"}
    w.pod("g0", {GPU: "4"}, 1, node="n1", annotations=gang)
    w.pod("g1", {GPU: "4"}, 1, node="n1", annotations=gang)
    w.pod("lone", {GPU: "4"}, 1, node="n2")
    w.pod("keep", {GPU: "4"}, 50, node="n2")
    await w.settle()
    w.pod("high", {GPU: "4"}, 10)
    await w.settle()
    assert w.preempted == [("lone", "high")]


async def test_a_gang_preempts_as_a_whole_then_binds_whole() -> None:
    w = World({"n1": (64, 8), "n2": (64, 8)})
    for i in range(4):
        w.pod(f"low{i}", {GPU: "4"}, 1, node=f"n{i % 2 + 1}")
    await w.settle()
    gang = {GROUP: "hi", SIZE: "2"}
    w.pod("h0", {GPU: "8"}, 10, annotations=gang)
    w.pod("h1", {GPU: "8"}, 10, annotations=gang)
    await w.settle()
    assert sorted(v for v, _ in w.preempted) == ["low0", "low1", "low2", "low3"]
    assert sorted(str(n) for _, n in w.nominations) == ["n1", "n2"]
    assert not {"h0", "h1"} & set(w.bound)
    w.gone("low0", "low1", "low2", "low3")
    await w.settle()
    assert sorted(w.bound[h] for h in ("h0", "h1")) == ["n1", "n2"]


async def test_a_gang_that_cannot_fit_whole_preempts_nothing() -> None:
    w = World({"n1": (64, 8), "n2": (64, 8)})
    w.pod("low", {GPU: "8"}, 1, node="n1")
    w.pod("vip", {GPU: "8"}, 50, node="n2")  # above the gang: it stays, so one member can't fit
    await w.settle()
    gang = {GROUP: "hi", SIZE: "2"}
    w.pod("h0", {GPU: "8"}, 10, annotations=gang)
    w.pod("h1", {GPU: "8"}, 10, annotations=gang)
    await w.settle()
    assert w.preempted == []
    assert w.nominations == []
    assert any("preemption: no domain fits the gang" in m for m in w.said("h0"))


# -- what the plugins that count pods beyond the node see in a dry run (kube-scheduler re-runs
# every filter with the victims off: PreFilterExtensions RemovePod/AddPod)
def _apart_from(app: str, key: str = HOST) -> dict[str, Any]:
    rule = [{"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]
    return {
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": rule}}
    }


async def test_a_lower_priority_pod_the_preemptor_s_anti_affinity_repels_is_its_victim() -> None:
    w = World({"n1": (8, 0), "n2": (8, 0)})
    w.pod("web-low", {"cpu": "1"}, 1, node="n1", labels={"app": "web"})
    w.pod("web-vip", {"cpu": "1"}, 50, node="n2", labels={"app": "web"})  # above it: stays
    await w.settle()
    w.pod("high", {"cpu": "1"}, 10, spec_extra=_apart_from("web"))
    await w.settle()
    # room enough on both nodes: only the anti-affinity keeps it out, and only n1's web pod
    # is below it
    assert "InterPodAffinity: node(s) didn't match pod anti-affinity rules" in w.said("high")[0]
    assert w.preempted == [("web-low", "high")]
    assert w.nominations == [("high", "n1")]
    w.gone("web-low")
    await w.settle()
    assert w.bound["high"] == "n1"


async def test_a_lower_priority_pod_whose_anti_affinity_repels_the_preemptor_is_its_victim() -> (
    None
):
    w = World({"n1": (8, 0)})
    w.pod("guard", {"cpu": "1"}, 1, labels={"app": "db"}, spec_extra=_apart_from("web"))
    await w.settle()
    w.pod("high", {"cpu": "1"}, 10, labels={"app": "web"})
    await w.settle()
    assert "existing pods anti-affinity rules" in w.said("high")[0]
    assert w.preempted == [("guard", "high")]


async def test_a_spread_met_only_once_a_lower_priority_replica_is_gone_preempts_it() -> None:
    w = World({"n1": (8, 0), "n2": (2, 0)}, zones={"n1": "a", "n2": "b"})
    w.pod("web-low", {"cpu": "1"}, 1, node="n1", labels={"app": "web"})
    w.pod("filler", {"cpu": "2"}, 50, node="n2")  # zone b full, and above the preemptor
    await w.settle()
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    }
    w.pod("high", {"cpu": "1"}, 10, labels={"app": "web"}, spec_extra=spread)
    await w.settle()
    # zone a already holds one replica more than zone b: a second there is a skew of 2
    assert "PodTopologySpread: node(s) didn't match pod topology spread" in w.said("high")[0]
    assert w.preempted == [("web-low", "high")]
    assert w.nominations == [("high", "n1")]


def _rwop_claim(w: World, name: str) -> None:
    """A ReadWriteOncePod claim bound to a PV that any node can mount."""
    pv = {
        "metadata": {"name": f"pv-{name}", "resourceVersion": "1"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOncePod"],
            "storageClassName": "manual",
            "claimRef": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        },
        "status": {"phase": "Bound"},
    }
    claim = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
        },
        "spec": {
            "accessModes": ["ReadWriteOncePod"],
            "storageClassName": "manual",
            "volumeName": f"pv-{name}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
        "status": {"phase": "Bound"},
    }
    w.feed._handle("persistentvolumes", "ADDED", pv)
    w.feed._handle("persistentvolumeclaims", "ADDED", claim)


async def test_the_lower_priority_pod_using_a_read_write_once_pod_claim_is_the_victim() -> None:
    w = World({"n1": (8, 0), "n2": (8, 0)})
    _rwop_claim(w, "data")
    uses = {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
    w.pod("holder", {"cpu": "1"}, 1, node="n1", spec_extra=uses)
    w.pod("other", {"cpu": "1"}, 1, node="n2")
    await w.settle()
    assert w.bound == {"holder": "n1", "other": "n2"}
    w.pod("high", {"cpu": "1"}, 10, spec_extra=uses)
    await w.settle()
    assert "ReadWriteOncePod access mode" in w.said("high")[0]
    # kube-scheduler's VolumeRestrictions RemovePod: only the holder's going frees the claim
    assert w.preempted == [("holder", "high")]
    assert w.nominations == [("high", "n1")]


async def test_a_victim_gang_leaves_the_zone_whole_for_the_preemptor_s_anti_affinity() -> None:
    w = World({"n1": (8, 0), "n2": (8, 0)}, zones={"n1": "a", "n2": "a"})
    gang = {GROUP: "lo", SIZE: "2"}
    for i in (1, 2):
        w.pod(f"g{i}", {"cpu": "1"}, 1, node=f"n{i}", labels={"app": "g"}, annotations=gang)
    await w.settle()
    assert len(w.bound) == 2
    w.pod("high", {"cpu": "1"}, 10, spec_extra=_apart_from("g", ZONE))
    await w.settle()
    # evicting the member on one node alone would leave the other in the zone: the whole gang
    # goes, and the dry run sees both leave
    assert sorted(v for v, _ in w.preempted) == ["g1", "g2"]
    assert len(w.nominations) == 1
