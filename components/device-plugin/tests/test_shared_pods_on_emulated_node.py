"""Shared pods started by the emulated kubelet on a KWOK node, with the whole daemon running.

The kubelet calls Allocate once per (container, resource): a container asking both gpu-core and
gpu-memory gets two calls, a pod with two shared containers gets one call per container. Each
container must get exactly its own decision, one Runtime allocation, and the same injection from
both of its calls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes import client

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.deviceplugin.assignment import ALLOCATION, ASSIGNMENT, marks
from lj_runtimekit_device_plugin.model import GIB
from lj_runtimekit_device_plugin.settings import load

pytestmark = pytest.mark.cluster

CORE = "aliyun.com/gpu-core"
MEM = "aliyun.com/gpu-memory"
GPU = "aliyun.com/gpu"


@pytest_asyncio.fixture(params=["apiserver", "kubelet"])
async def plugin(request: Any, cluster: Any, emulated_gpu_node: Any) -> AsyncIterator[Any]:
    node = emulated_gpu_node
    s = load(
        [
            "--socket-dir",
            str(node.simulator.socket_dir),
            "--plugin-dir",
            node.plugin_dir,
            "--port",
            "0",
            "--node-name",
            node.name,
            "--kubeconfig",
            cluster.kubeconfig,
            "--pods-source",
            request.param,
            "--kubelet-pods-url",
            node.emulator.pods_url,
            "--pod-resources-socket",
            node.emulator.pod_resources_socket,
            "--reconcile-interval",
            "0.5",
            "--release-grace",
            "0.5",
        ],
        {},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(s, stop))
    try:
        await _until(lambda: {GPU, CORE, MEM} <= set(node.emulator.endpoints), within_s=20)
        yield node
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _until(cond: Any, within_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _pod(name: str, node: str, at: str, containers: dict[str, tuple[str, int, int]]) -> Any:
    """``containers``: name → (device, core, memory GiB); a zero asks none of that resource."""
    assignment = {
        "version": "v1",
        "node": node,
        "assumedAt": at,
        "containers": [
            {"name": c, "devices": [{"id": d, "core": core, "memoryGiB": mem}]}
            for c, (d, core, mem) in containers.items()
        ],
    }
    specs = []
    for c, (_, core, mem) in containers.items():
        limits = {**({CORE: str(core)} if core else {}), **({MEM: str(mem)} if mem else {})}
        specs.append({"name": c, "image": "busybox", "resources": {"limits": limits}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ASSIGNMENT: json.dumps(assignment)}},
        "spec": {"nodeName": node, "containers": specs, "tolerations": [{"operator": "Exists"}]},
    }


def _envs(response: Any) -> dict[str, str]:
    return dict(response.envs)


async def test_core_and_memory_containers_and_two_container_pods_get_their_own_decisions(
    cluster: Any, namespace: str, plugin: Any
) -> None:
    node = plugin
    wanted = {
        # two pods asking core and memory in one container (never the same shape pending at
        # once on one node: the scheduler's side of the contract)
        "both-a": {"main": ("gpu-2", 30, 8)},
        "both-b": {"main": ("gpu-3", 40, 12)},
        # two shared containers in one pod, one asking core, the other memory
        "pair": {"train": ("gpu-4", 20, 0), "eval": ("gpu-5", 0, 10)},
    }
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        for k, (name, containers) in enumerate(wanted.items()):
            core.create_namespaced_pod(
                namespace, _pod(name, node.name, f"2026-12-03T00:00:0{k}Z", containers)
            )
        calls = sum(
            (core_ > 0) + (mem > 0) for cs in wanted.values() for (_, core_, mem) in cs.values()
        )
        emu = node.emulator
        await _until(lambda: len([r for r in emu.allocations if r.pod_uid]) >= calls)
        records = [r for r in emu.allocations if r.pod_uid]
        assert len(records) == calls
        live = node.simulator.allocations()
        for name, containers in wanted.items():
            meta: Any = core.read_namespaced_pod(name, namespace).metadata
            mark = marks(meta.annotations)
            for container, (device, core_, mem) in containers.items():
                mine = [r for r in records if r.pod == f"{namespace}/{name}"]
                mine = [r for r in mine if r.container == container]
                envs = [_envs(r.response) for r in mine]
                # every call of the container answered with its own device and one allocation
                assert all(e["LJ_VISIBLE_DEVICES"] == device for e in envs), (name, envs)
                assert len({e["LJ_ALLOCATION_ID"] for e in envs}) == 1
                assert all(e == envs[0] for e in envs)
                assert envs[0]["LJ_GPU_CORE_PERCENT"] == str(core_)
                assert envs[0]["LJ_GPU_MEMORY_LIMIT_BYTES"] == str(mem * GIB)
                held = [a for a in live if a.pod.uid == meta.uid]
                held = [a for a in held if a.container == container]
                assert [a.device_ids for a in held] == [(device,)]
                assert (held[0].core_percent, held[0].memory_bytes) == (core_, mem * GIB)
                resources = {CORE} if not mem else {MEM} if not core_ else {CORE, MEM}
                assert set(mark[container]) == resources
                assert set(mark[container].values()) == {(held[0].id,)}
        assert len(live) == sum(len(cs) for cs in wanted.values())


def _whole_pod(name: str, node: str, at: str, devices: list[str] | None, n: int) -> Any:
    """A pod asking ``n`` whole GPUs; ``devices`` is the scheduler's choice (None: no decision,
    as for a pod placed by another scheduler)."""
    annotations = {}
    if devices is not None:
        decision = {
            "version": "v1",
            "node": node,
            "assumedAt": at,
            "containers": [
                {"name": "main", "devices": [{"id": d, "whole": True} for d in devices]}
            ],
        }
        annotations[ASSIGNMENT] = json.dumps(decision)
    limits = {GPU: str(n)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


async def test_whole_gpus_are_the_schedulers_and_never_a_device_it_gave_out_as_shares(
    cluster: Any, namespace: str, plugin: Any
) -> None:
    """The kubelet picks whole devices itself (GetPreferredAllocation names no pod). Left to
    topology it takes gpu-0 first: the scheduler's choice must win, and a pod without one must
    keep off gpu-0 and gpu-1, which the scheduler gave to shared pods not yet started."""
    node = plugin
    emu = node.emulator
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        # whole pods first: they are allocated before the shared pods their devices could steal
        core.create_namespaced_pod(
            namespace, _whole_pod("train", node.name, "2026-12-03T00:00:01Z", ["gpu-5", "gpu-6"], 2)
        )
        await _until(lambda: any(r.pod == f"{namespace}/train" for r in emu.allocations))
        core.create_namespaced_pod(
            namespace, _pod("shared-a", node.name, "2026-12-03T00:00:02Z", {"m": ("gpu-0", 30, 8)})
        )
        core.create_namespaced_pod(
            namespace, _pod("shared-b", node.name, "2026-12-03T00:00:03Z", {"m": ("gpu-1", 40, 10)})
        )
        # the shared pods wait on the apiserver view: their decisions are seen before this one
        await asyncio.sleep(0.5)
        core.create_namespaced_pod(namespace, _whole_pod("other", node.name, "", None, 2))
        await _until(lambda: len([r for r in emu.allocations if r.pod_uid]) >= 6)
    by_pod: dict[str, set[str]] = {}
    for r in emu.allocations:
        if r.pod_uid:
            by_pod.setdefault(str(r.pod).split("/")[1], set()).update(r.device_ids)
    assert by_pod["train"] == {"gpu-5", "gpu-6"}
    assert not by_pod["other"] & {"gpu-0", "gpu-1", "gpu-5", "gpu-6"}, by_pod["other"]
    # shared unit ids are counters, not devices: the Runtime's allocations say which device
    held = {a.pod.name: a.device_ids for a in node.simulator.allocations() if a.container == "m"}
    assert held == {"shared-a": ("gpu-0",), "shared-b": ("gpu-1",)}


async def test_shared_and_whole_pods_cycle_through_the_same_gpus_and_all_come_back(
    cluster: Any, namespace: str, plugin: Any
) -> None:
    """Round after round, two shared pods fill gpu-0 (100 % core) and a whole pod takes gpu-5;
    then all are deleted (the kubelet or the Runtime restarted in some rounds) and the next round
    takes the same devices. Before release existed, round 2's Allocates were refused (gpu-0
    full, gpu-5 held whole). At the end the Runtime holds nothing."""
    node = plugin
    emu = node.emulator
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        for r in range(6):
            shared = {f"s{r}a": ("gpu-0", 60, 40), f"s{r}b": ("gpu-0", 40, 30)}
            for k, (name, dec) in enumerate(shared.items()):
                at = f"2026-12-03T00:{r:02d}:0{k}Z"
                core.create_namespaced_pod(namespace, _pod(name, node.name, at, {"main": dec}))
            core.create_namespaced_pod(
                namespace,
                _whole_pod(f"w{r}", node.name, f"2026-12-03T00:{r:02d}:09Z", ["gpu-5"], 1),
            )
            mine = {f"{namespace}/{n}" for n in [*shared, f"w{r}"]}
            await _until(lambda m=mine: len([x for x in emu.allocations if x.pod in m]) >= 5)
            records = [x for x in emu.allocations if x.pod in mine]
            for name, (device, core_, _) in shared.items():
                envs = [_envs(x.response) for x in records if x.pod == f"{namespace}/{name}"]
                assert {e["LJ_VISIBLE_DEVICES"] for e in envs} == {device}
                assert {e["LJ_GPU_CORE_PERCENT"] for e in envs} == {str(core_)}
            whole = [_envs(x.response) for x in records if x.pod == f"{namespace}/w{r}"]
            assert whole[0]["LJ_VISIBLE_DEVICES"] == "gpu-5"
            # the whole pod is marked with the devices it really got, under its real owner
            meta: Any = core.read_namespaced_pod(f"w{r}", namespace).metadata
            ann = meta.annotations
            assert json.loads(ann[ALLOCATION])["devices"] == {"main": {GPU: ["gpu-5"]}}
            owners = {(a.pod.name, a.container) for a in node.simulator.allocations()}
            assert (f"w{r}", "main") in owners
            if r % 3 == 1:
                before = emu.resources()
                await emu.restart()
                # as on a real node: until the plugin has registered again and sent its devices,
                # the kubelet admits no pod that needs them (UnexpectedAdmissionError); wait
                await _until(lambda b=before: emu.resources() == b, within_s=20)
            if r % 3 == 2:
                await node.simulator.restart()
            for name in [*shared, f"w{r}"]:
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        assert emu.failures == [], emu.failures
        await _until(lambda: node.simulator.allocations() == [], within_s=20)


async def test_two_pending_pods_of_one_shape_are_refused_with_an_event_never_crossed(
    cluster: Any, namespace: str, plugin: Any
) -> None:
    """A broken contract (two same-shaped pending pods, e.g. bound by another client): the
    kubelet names no pod, so the plugin refuses rather than guess, and says why on both pods.
    Before: the oldest decision went to whichever pod the kubelet admitted first."""
    node = plugin
    emu = node.emulator
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        for k, gpu in enumerate(["gpu-6", "gpu-7"]):
            body = _pod(f"twin-{k}", node.name, f"2026-12-03T00:00:0{k}Z", {"m": (gpu, 30, 0)})
            core.create_namespaced_pod(namespace, body)

        def reasons() -> dict[str, set[str]]:
            events = core.list_namespaced_event(namespace).items
            out: dict[str, set[str]] = {}
            for e in events:
                out.setdefault(str(e.involved_object.name), set()).add(str(e.reason))
            return out

        await _until(
            lambda: all("AmbiguousGpuAssignment" in reasons().get(f"twin-{k}", ()) for k in (0, 1))
        )
        # the Event is posted before the Allocate error reaches the kubelet
        await _until(lambda: bool(emu.failures))
        assert all("pending containers" in f[3] for f in emu.failures)
        assert not [a for a in node.simulator.allocations() if a.pod.name.startswith("twin-")]
