"""The loop over a fake apiserver edge: GPU decisions, gangs all-or-nothing, events."""

import asyncio
import json
from typing import Any, cast

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.errors import TemporaryError
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.framework import CHOSEN_DEVICES, OK, CycleState, Profile, Status
from lj_runtimekit_scheduler.gpu import Choice, Slice
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.model import ASSIGNMENT_ANNOTATION, Device, Pod
from lj_runtimekit_scheduler.plugins import default_binder
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.scheduler import Scheduler
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState, NodeInfo


class Edge:
    def __init__(self) -> None:
        self.bound: dict[str, str] = {}
        self.annotations: dict[str, dict[str, str]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.fail_once: set[str] = set()
        """Pods whose first binding the apiserver refuses."""

    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        if pod.name in self.fail_once:
            self.fail_once.discard(pod.name)
            raise TemporaryError("apiserver unavailable")
        self.bound[pod.name] = node
        self.annotations[pod.name] = dict(annotations)

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))


def gpu_node(name: str, block: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"lj_runtimekit_enable": "true", "network.topology/block": block},
        },
        "status": {
            "allocatable": {
                "cpu": "32",
                "memory": "256Gi",
                "pods": "110",
                "aliyun.com/gpu": "8",
                "aliyun.com/gpu-core": "800",
                "aliyun.com/gpu-memory": "640",
            },
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, limits: dict[str, str], **annotations: str) -> Pod:
    return objects.pod(
        {
            "metadata": {"uid": name, "name": name, "namespace": "ns", "annotations": annotations},
            "spec": {
                "schedulerName": "lj-runtimekit-scheduler",
                "containers": [
                    {"name": "main", "resources": {"requests": limits, "limits": limits}}
                ],
            },
        }
    )


def setup(blocks: dict[str, str]) -> tuple[Scheduler, Edge, ClusterState]:
    state = ClusterState()
    for name, block in blocks.items():
        state.set_node(objects.node(gpu_node(name, block)))
        state.set_devices(
            name, tuple(Device(f"gpu-{i}", "GPU", 80, True, i // 4, i // 4, i) for i in range(8))
        )
    edge = Edge()
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
    while (pod := sched.queue.pop(sched.clock())) is not None:
        sched.schedule(pod)
        await sched.drain()


async def test_shared_pods_get_their_own_slices_and_a_written_decision() -> None:
    sched, edge, _ = setup({"n1": "b1"})
    for i in range(3):
        sched.queue.add(
            gpu_pod(f"p{i}", {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "40"}), 0
        )
    await run_until_idle(sched)
    decisions = [json.loads(edge.annotations[f"p{i}"][ASSIGNMENT_ANNOTATION]) for i in range(3)]
    slices = [d["containers"][0]["devices"][0] for d in decisions]
    assert all(d["node"] == "n1" and d["version"] == "v1" for d in decisions)
    by_gpu: dict[str, int] = {}
    for s in slices:
        by_gpu[s["id"]] = by_gpu.get(s["id"], 0) + s["core"]
    assert max(by_gpu.values()) <= 100
    assert len(by_gpu) == 2  # binpack: two halves on one GPU, the third on another


async def test_gang_waits_whole_then_lands_in_one_block() -> None:
    sched, edge, _ = setup({"a1": "A", "a2": "A", "b1": "B"})
    group = {
        "lj-runtimekit-scheduler/pod-group": "g",
        "lj-runtimekit-scheduler/pod-group-size": "4",
    }
    for i in range(3):
        sched.queue.add(gpu_pod(f"g{i}", {"aliyun.com/gpu": "4"}, **group), 0)
    await run_until_idle(sched)
    assert edge.bound == {}
    assert any("waiting for 1 more" in m for _, r, m in edge.events)
    sched.queue.add(gpu_pod("g3", {"aliyun.com/gpu": "4"}, **group), 0)
    sched.queue.cluster_changed(sched.clock())
    await asyncio.sleep(0)
    sched.queue.flush(sched.clock() + 100)
    while (pod := sched.queue.pop(sched.clock() + 100)) is not None:
        sched.schedule(pod)
        await sched.drain()
    assert sorted(edge.bound) == ["g0", "g1", "g2", "g3"]
    assert set(edge.bound.values()) == {"a1", "a2"}


async def test_a_cluster_change_while_a_gang_binds_does_not_place_it_again() -> None:
    # seen in the demo beside `make test`: two members parked while they waited for the third,
    # the gang placed, and a device plugin's confirmation during its binds unparked them; the
    # gang was placed a second time (other devices, other nodes), whose binds got 409s, and
    # the scheduler kept counting the second decision
    sched, edge, _ = setup({"a1": "A", "a2": "A"})
    group = {
        "lj-runtimekit-scheduler/pod-group": "g",
        "lj-runtimekit-scheduler/pod-group-size": "3",
    }
    for i in range(2):
        sched.queue.add(gpu_pod(f"g{i}", {"aliyun.com/gpu": "1"}, **group), 0)
    await run_until_idle(sched)
    assert edge.bound == {}
    release = asyncio.Event()
    calls: list[str] = []
    bind = edge.bind

    async def slow_bind(pod: Pod, node: str, annotations: dict[str, str]) -> None:
        calls.append(pod.name)
        await release.wait()
        await bind(pod, node, annotations)

    edge.bind = slow_bind  # type: ignore[method-assign]
    sched.queue.add(gpu_pod("g2", {"aliyun.com/gpu": "1"}, **group), 0)
    pod = sched.queue.pop(sched.clock())
    assert pod is not None
    sched.schedule(pod)
    await asyncio.sleep(0.01)
    assert sorted(calls) == ["g0", "g1", "g2"]
    decided = {u: sched.state.pods[u][2] for u in ("g0", "g1", "g2")}
    sched.queue.cluster_changed(sched.clock())  # e.g. a pod confirmed on another node
    sched.queue.pod_placed(sched.clock())
    assert sched.queue.pop(sched.clock() + 100) is None, "a member in flight was popped again"
    release.set()
    await sched.drain()
    assert sorted(calls) == ["g0", "g1", "g2"]
    assert {u: sched.state.pods[u][2] for u in ("g0", "g1", "g2")} == decided


async def test_a_member_whose_binding_failed_rejoins_its_gang_s_domain() -> None:
    # block C (one node) is the smallest domain: too small for the gang, not for one member
    sched, edge, _ = setup({"a1": "A", "a2": "A", "c1": "C"})
    group = {
        "lj-runtimekit-scheduler/pod-group": "g",
        "lj-runtimekit-scheduler/pod-group-size": "4",
    }
    edge.fail_once.add("g3")
    for i in range(4):
        sched.queue.add(gpu_pod(f"g{i}", {"aliyun.com/gpu": "4"}, **group), 0)
    await run_until_idle(sched)
    assert sorted(edge.bound) == ["g0", "g1", "g2"]
    assert any(p == "g3" and "binding to" in m for p, _, m in edge.events)
    sched.queue.flush(sched.clock() + 100)
    while (pod := sched.queue.pop(sched.clock() + 100)) is not None:
        sched.schedule(pod)
        await sched.drain()
    assert sorted(edge.bound) == ["g0", "g1", "g2", "g3"]
    assert set(edge.bound.values()) == {"a1", "a2"}


async def test_a_gang_incomplete_past_its_timeout_is_warned_about_once() -> None:
    sched, edge, _ = setup({"a1": "A"})
    now = [0.0]
    sched.clock = lambda: now[0]
    group = {
        "lj-runtimekit-scheduler/pod-group": "g",
        "lj-runtimekit-scheduler/pod-group-size": "3",
    }
    for i in range(2):
        sched.queue.add(gpu_pod(f"g{i}", {"aliyun.com/gpu": "1"}, **group), 0)

    def warnings() -> list[str]:
        return [m for _, r, m in edge.events if r == "GangIncomplete"]

    await run_until_idle(sched)
    seen = [len(warnings())]
    for at in (30.0, 61.0, 200.0):  # each retry of the parked members
        now[0] = at
        sched.queue.cluster_changed(at)
        sched.queue.flush(at + 100)
        await run_until_idle(sched)
        seen.append(len(warnings()))
    assert seen == [0, 0, 1, 1]
    assert "has 2 of 3 members after 60 s" in warnings()[0]
    assert edge.bound == {}
    # the alert LJRuntimeKitGangOverdue reads this gauge
    assert sched.metrics.registry.get_sample_value("lj_scheduler_gangs_overdue") == 1


async def test_gang_members_that_disagree_on_the_size_are_told_and_placed_at_the_largest() -> None:
    # issue 34, finding 9: sizes 2 and 4 made two gangs, each waiting forever for a member
    sched, edge, _ = setup({"a1": "A", "a2": "A"})
    sizes = {"g0": "2", "g1": "4", "g2": "4", "g3": "4"}
    for name, size in sizes.items():
        group = {
            "lj-runtimekit-scheduler/pod-group": "g",
            "lj-runtimekit-scheduler/pod-group-size": size,
        }
        sched.queue.add(gpu_pod(name, {"aliyun.com/gpu": "4"}, **group), 0)
    await run_until_idle(sched)
    assert sorted(edge.bound) == ["g0", "g1", "g2", "g3"]
    conflicts = {p: m for p, r, m in edge.events if r == "GangSizeConflict"}
    assert sorted(conflicts) == ["g0", "g1", "g2", "g3"]
    message = conflicts["g0"]
    assert "2: g0; 4: g1, g2, g3" in message
    assert "the largest size any member gives applies" in message
    assert len([r for _, r, _ in edge.events if r == "GangSizeConflict"]) == 4


async def test_a_gang_short_of_its_largest_size_waits_whole_and_says_why() -> None:
    sched, edge, _ = setup({"a1": "A", "a2": "A"})
    for name, size in {"g0": "2", "g1": "2", "g2": "4"}.items():
        group = {
            "lj-runtimekit-scheduler/pod-group": "g",
            "lj-runtimekit-scheduler/pod-group-size": size,
        }
        sched.queue.add(gpu_pod(name, {"aliyun.com/gpu": "4"}, **group), 0)
    await run_until_idle(sched)
    assert edge.bound == {}  # not the two that asked for 2 while the third asks for 4
    assert {p for p, r, _ in edge.events if r == "GangSizeConflict"} == {"g0", "g1", "g2"}
    assert any("waiting for 1 more of 4 members" in m for _, _, m in edge.events)


def bound_json(name: str, limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """The pod as the watch shows it once bound to n1."""
    return {
        "metadata": {"uid": name, "name": name, "namespace": "ns", "annotations": annotations},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler",
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"requests": limits, "limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


async def test_an_edited_assignment_on_a_bound_pod_frees_nothing_and_gets_an_event() -> None:
    # issue 34, finding 10: the edit freed p1's 60 % of gpu-0 and the next pod got it too
    sched, edge, state = setup({"n1": "b1"})
    feed = Informers(cast(Any, None), sched.settings, state, sched.queue, sched.poke, recorder=edge)
    share = {"aliyun.com/gpu-core": "60", "aliyun.com/gpu-memory": "8"}
    sched.queue.add(gpu_pod("p1", share), 0)
    await run_until_idle(sched)
    written = edge.annotations["p1"][ASSIGNMENT_ANNOTATION]
    gpu_of_p1 = json.loads(written)["containers"][0]["devices"][0]["id"]
    feed._handle("pods", "MODIFIED", bound_json("p1", share, {ASSIGNMENT_ANNOTATION: written}))
    assert [r for _, r, _ in edge.events if r == "GpuAssignmentEdited"] == []
    other = "gpu-7" if gpu_of_p1 != "gpu-7" else "gpu-6"
    edited = written.replace(f'"{gpu_of_p1}"', f'"{other}"')
    for _ in range(2):  # the same edit seen twice (a resync) is reported once
        feed._handle("pods", "MODIFIED", bound_json("p1", share, {ASSIGNMENT_ANNOTATION: edited}))
    ((_, _, message),) = [(p, r, m) for p, r, m in edge.events if r == "GpuAssignmentEdited"]
    assert gpu_of_p1 in message
    assert other in message
    assert state.nodes["n1"].device_use[gpu_of_p1].core == 60, "the ledger keeps what it wrote"
    assert other not in state.nodes["n1"].device_use
    feed._handle("pods", "MODIFIED", bound_json("p1", share, {}))  # removed: the same
    assert state.nodes["n1"].device_use[gpu_of_p1].core == 60
    assert len([r for _, r, _ in edge.events if r == "GpuAssignmentEdited"]) == 2
    sched.queue.add(gpu_pod("p2", share), 0)
    await run_until_idle(sched)
    gpu_of_p2 = json.loads(edge.annotations["p2"][ASSIGNMENT_ANNOTATION])["containers"][0]
    assert gpu_of_p2["devices"][0]["id"] != gpu_of_p1, "never 120 % of one GPU"


async def test_unfit_pod_gets_a_failed_scheduling_event_naming_the_gpus() -> None:
    sched, edge, _ = setup({"n1": "b1"})
    sched.queue.add(gpu_pod("big", {"aliyun.com/gpu": "9"}), 0)
    await run_until_idle(sched)
    assert edge.bound == {}
    ((_, reason, message),) = edge.events
    assert reason == "FailedScheduling"
    assert "0/1 nodes are available" in message


class ChoosesGpu3:
    """A stand-in device plugin of the profile: writes its choice in the typed cycle-state slot."""

    NAME = "ChoosesGpu3"

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        choice = Choice((("main", (Slice("gpu-3", whole=True),)),))
        cs.setdefault(CHOSEN_DEVICES, {})[info.node.name] = choice
        return OK


async def test_the_loop_assumes_the_devices_the_cycle_state_holds_whoever_chose_them() -> None:
    # v1.13 fished GpuFit out of the profile by type and assumed only its choice
    sched, edge, state = setup({"n1": "b1"})
    sched.profile = Profile([(ChoosesGpu3(), 0), (default_binder.new(), 0)])
    sched.queue.add(gpu_pod("p", {"aliyun.com/gpu": "1"}), 0)
    await run_until_idle(sched)
    assert edge.bound == {"p": "n1"}
    assert state.nodes["n1"].device_use["gpu-3"].whole
