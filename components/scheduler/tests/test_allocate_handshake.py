"""The decision is what runs: on a node whose device plugin confirms allocations, no two pods
with pending allocations share a (resource, unit count), so the device plugin can always tell
which pod a kubelet Allocate is for (docs/contracts.md). Through the scheduler loop and the
informer's pod handler, over the fake apiserver edge of test_scheduler."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from lj_runtimekit_scheduler import objects
from lj_runtimekit_scheduler.errors import TemporaryError
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.model import ASSIGNMENT_ANNOTATION, Device, Pod
from lj_runtimekit_scheduler.plugins.allocate_handshake import bind_after
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.scheduler import Scheduler
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState


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


async def run_until_idle(sched: Scheduler) -> None:
    while (pod := sched.queue.pop(sched.clock())) is not None:
        sched.schedule(pod)
        await sched.drain()


ALLOCATED = "lj-runtimekit-device-plugin/allocated"
GANG = {"lj-runtimekit-scheduler/pod-group": "g", "lj-runtimekit-scheduler/pod-group-size": "2"}


def setup(
    nodes: tuple[str, ...] = ("n1",), confirms: bool = True, **cfg: Any
) -> tuple[Scheduler, Edge, ClusterState, Informers]:
    settings = Settings(leader_elect=False, **cfg)
    state = ClusterState(settings.resources)
    for name in nodes:
        state.set_node(objects.node(gpu_node(name, "b1")))
        devices = tuple(Device(f"gpu-{i}", "GPU", 80, True, 0, 0, i) for i in range(8))
        state.set_devices(name, devices, confirms=confirms)
    edge, metrics, queue = Edge(), Metrics(), SchedulingQueue()
    sched = Scheduler(
        settings,
        state=state,
        queue=queue,
        profile=build_profile(settings, state, metrics),
        binder=edge,
        recorder=edge,
        metrics=metrics,
    )
    informers = Informers(cast(Any, None), settings, state, queue, sched.poke)
    return sched, edge, state, informers


def watched(
    edge: Edge, name: str, limits: dict[str, str], *, mark: bool, **annotations: str
) -> dict[str, Any]:
    """The pod as the watch shows it once bound (and, with ``mark``, confirmed)."""
    notes = {**annotations, **edge.annotations[name]}
    if mark:
        notes[ALLOCATED] = "2026-01-01T00:00:00Z"
    return {
        "metadata": {"uid": name, "name": name, "namespace": "ns", "annotations": notes},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler",
            "nodeName": edge.bound[name],
            "containers": [{"name": "main", "resources": {"requests": limits, "limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


async def retry(sched: Scheduler) -> None:
    """Run what the queue holds once backoffs are over (15 s on), before the periodic retry of
    parked pods (60 s): a parked pod runs only when an event moved it back."""
    while (pod := sched.queue.pop(sched.clock() + 15)) is not None:
        sched.schedule(pod)
        await sched.drain()


CORE30 = {"aliyun.com/gpu-core": "30"}


async def test_same_request_waits_until_the_device_plugin_confirms_the_first() -> None:
    sched, edge, _, informers = setup()
    for name in ("p0", "p1"):
        sched.queue.add(gpu_pod(name, CORE30), 0)
    await run_until_idle(sched)
    assert edge.bound == {"p0": "n1"}
    (msg,) = [m for p, r, m in edge.events if p == "p1" and r == "FailedScheduling"]
    assert (
        "waiting for the device plugin on n1 to confirm pod ns/p0's devices "
        "(same request aliyun.com/gpu-core=30)" in msg
    )
    informers._pod("MODIFIED", watched(edge, "p0", CORE30, mark=False))
    await retry(sched)
    assert "p1" not in edge.bound  # bound, not yet confirmed: still ambiguous
    informers._pod("MODIFIED", watched(edge, "p0", CORE30, mark=True))
    await retry(sched)  # the mark requeued p1 at once, no periodic retry needed
    assert edge.bound == {"p0": "n1", "p1": "n1"}


async def test_a_pending_pod_that_goes_away_unblocks_its_node() -> None:
    sched, edge, _, informers = setup()
    for name in ("p0", "p1"):
        sched.queue.add(gpu_pod(name, CORE30), 0)
    await run_until_idle(sched)
    informers._pod("DELETED", watched(edge, "p0", CORE30, mark=False))
    await retry(sched)
    assert edge.bound["p1"] == "n1"


async def test_different_requests_go_to_one_node_at_once() -> None:
    sched, edge, state, _ = setup()
    shapes = [
        {"aliyun.com/gpu-core": "30"},
        {"aliyun.com/gpu-core": "40"},
        {"aliyun.com/gpu-core": "20", "aliyun.com/gpu-memory": "8"},
        {"aliyun.com/gpu": "1"},
        {"aliyun.com/gpu": "2"},
    ]
    for i, limits in enumerate(shapes):
        sched.queue.add(gpu_pod(f"p{i}", limits), 0)
    await run_until_idle(sched)
    assert len(edge.bound) == len(shapes)
    assert len(state.nodes["n1"].pending) == len(shapes)


async def test_a_shared_unit_count_blocks_even_with_other_resources_differing() -> None:
    # both containers ask gpu-core 30: the kubelet's gpu-core Allocate could be either's
    sched, edge, _, _ = setup()
    sched.queue.add(gpu_pod("a", {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "8"}), 0)
    sched.queue.add(gpu_pod("b", {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "16"}), 0)
    await run_until_idle(sched)
    assert edge.bound == {"a": "n1"}


async def test_the_next_same_request_goes_to_another_node_rather_than_wait() -> None:
    sched, edge, _, _ = setup(("n1", "n2"))
    for name in ("p0", "p1"):
        sched.queue.add(gpu_pod(name, CORE30), 0)
    await run_until_idle(sched)
    assert sorted(edge.bound.values()) == ["n1", "n2"]


async def test_nodes_without_a_device_plugin_take_same_requests_at_once() -> None:
    # KWOK nodes of the cluster tests and the bench: nothing there would ever confirm
    sched, edge, _, _ = setup(confirms=False)
    for i in range(4):
        sched.queue.add(gpu_pod(f"p{i}", CORE30), 0)
    await run_until_idle(sched)
    assert len(edge.bound) == 4


async def test_a_gang_s_same_request_members_share_a_node_bound_one_after_another() -> None:
    sched, edge, state, informers = setup()
    one = {"aliyun.com/gpu": "1"}
    for name in ("g0", "g1"):
        sched.queue.add(gpu_pod(name, one, **GANG), 0)
    pod = sched.queue.pop(0)
    assert pod is not None
    sched.schedule(pod)
    for _ in range(5):
        await asyncio.sleep(0)
    assert list(edge.bound) == ["g0"]
    assert state.pods["g1"][1] == "n1"  # placed and held, not yet bound
    informers._pod("MODIFIED", watched(edge, "g0", one, mark=True, **GANG))
    await sched.drain()
    assert edge.bound == {"g0": "n1", "g1": "n1"}
    gpus = {
        json.loads(edge.annotations[n][ASSIGNMENT_ANNOTATION])["containers"][0]["devices"][0]["id"]
        for n in ("g0", "g1")
    }
    assert len(gpus) == 2


async def test_a_gang_member_is_given_back_when_the_device_plugin_never_confirms() -> None:
    sched, edge, state, _ = setup(confirm_timeout=0.05)
    for name in ("g0", "g1"):
        sched.queue.add(gpu_pod(name, {"aliyun.com/gpu": "1"}, **GANG), 0)
    pod = sched.queue.pop(0)
    assert pod is not None
    sched.schedule(pod)
    await sched.drain()
    assert list(edge.bound) == ["g0"]
    assert "g1" not in state.pods
    assert sched.queue.get("g1") is not None
    assert any(p == "g1" and "did not confirm pod ns/g0's devices" in m for p, _, m in edge.events)


def test_bind_order_waits_only_for_same_request_members_on_the_same_confirming_node() -> None:
    a = gpu_pod("a", {"aliyun.com/gpu": "1"})
    b = gpu_pod("b", {"aliyun.com/gpu": "1"})
    c = gpu_pod("c", {"aliyun.com/gpu": "2"})
    d = gpu_pod("d", {"aliyun.com/gpu": "1"})
    e = gpu_pod("e", {"aliyun.com/gpu": "1"})
    items = [(a, "n1"), (b, "n1"), (c, "n1"), (d, "n2"), (e, "kwok")]
    assert bind_after(items, {"n1", "n2"}) == [[], ["a"], [], [], []]


async def test_a_renamed_gpu_core_keeps_fit_choice_shares_and_the_assignment() -> None:
    vcore = "example.com/vcore"
    sched, edge, state, _ = setup(resource_gpu_core=vcore)
    raw = gpu_node("n1", "b1")
    alloc = raw["status"]["allocatable"]
    alloc[vcore] = alloc.pop("aliyun.com/gpu-core")
    state.set_node(objects.node(raw))
    for i in range(3):
        pod = objects.pod(
            {
                "metadata": {"uid": f"p{i}", "name": f"p{i}", "namespace": "ns"},
                "spec": {
                    "schedulerName": "lj-runtimekit-scheduler",
                    "containers": [{"name": "main", "resources": {"limits": {vcore: str(50 + i)}}}],
                },
            },
            sched.settings.resources,
        )
        sched.queue.add(pod, 0)
    await run_until_idle(sched)
    assert sorted(edge.bound) == ["p0", "p1", "p2"]
    slices = [
        json.loads(edge.annotations[f"p{i}"][ASSIGNMENT_ANNOTATION])["containers"][0]["devices"][0]
        for i in range(3)
    ]
    assert [s["core"] for s in slices] == [50, 51, 52]
    per_gpu: dict[str, int] = {}
    for s in slices:
        per_gpu[s["id"]] = per_gpu.get(s["id"], 0) + s["core"]
    assert max(per_gpu.values()) <= 100  # shares counted under the new name
    assert {u for p in state.nodes["n1"].pending.values() for u in p.units} == {
        ("gpu-core", 50),
        ("gpu-core", 51),
        ("gpu-core", 52),
    }
    # the old name is no longer ours: a plain extended resource the node does not have
    sched.queue.add(gpu_pod("old", {"aliyun.com/gpu-core": "10"}), 0)
    await run_until_idle(sched)
    assert "old" not in edge.bound
    assert any(p == "old" and "Insufficient aliyun.com/gpu-core" in m for p, _, m in edge.events)


def group_pod(name: str, limits: dict[str, str], group: str) -> Pod:
    return objects.pod(
        {
            "metadata": {"uid": name, "name": name, "namespace": "ns"},
            "spec": {
                "schedulerName": "lj-runtimekit-scheduler",
                "schedulingGroup": {"podGroupName": group},
                "containers": [
                    {"name": "main", "resources": {"requests": limits, "limits": limits}}
                ],
            },
        }
    )


def pod_group(informers: Informers, name: str, policy: dict[str, Any]) -> None:
    obj = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"schedulingPolicy": policy}}
    informers._handle("podgroups", "ADDED", obj)


async def test_a_basic_pod_group_s_same_request_pods_wait_as_lone_pods_do() -> None:
    sched, edge, _, informers = setup()
    pod_group(informers, "svc", {"basic": {}})
    one = {"aliyun.com/gpu": "1"}
    for name in ("s0", "s1"):
        sched.queue.add(group_pod(name, one, "svc"), 0)
    await run_until_idle(sched)
    assert edge.bound == {"s0": "n1"}  # s1 is no gang member: it waits for s0's mark
    assert any(p == "s1" and "waiting for the device plugin" in m for p, _, m in edge.events)


async def test_a_pod_group_member_placed_after_the_others_binds_after_their_mark() -> None:
    sched, edge, state, informers = setup()
    pod_group(informers, "g", {"gang": {"minCount": 1}})
    one = {"aliyun.com/gpu": "1"}
    sched.queue.add(group_pod("g0", one, "g"), 0)
    await run_until_idle(sched)
    assert edge.bound == {"g0": "n1"}  # bound, not yet confirmed by the device plugin
    sched.queue.add(group_pod("g1", one, "g"), 0)  # joins its placed gang on n1
    pod = sched.queue.pop(0)
    assert pod is not None
    sched.schedule(pod)
    for _ in range(5):
        await asyncio.sleep(0)
    assert state.pods["g1"][1] == "n1"
    assert "g1" not in edge.bound  # two same-request pods unconfirmed on n1: never
    raw = watched(edge, "g0", one, mark=True)
    raw["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    informers._pod("MODIFIED", raw)
    await sched.drain()
    assert edge.bound == {"g0": "n1", "g1": "n1"}
