"""Release and attribution with the whole daemon, the kubelet emulator and the runtime simulator
(no cluster: pods come from the emulator's /pods; whole GPUs, PPUs and partitions).

At the end of every scenario the Runtime must hold exactly the live containers' allocations.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_testkit.kubelet import KubeletEmulator
from lj_runtimekit_testkit.simulator.simulator import Simulator

GPU = "aliyun.com/gpu"
#: How the Runtime refuses a device someone still holds (a leak, when nothing live holds it).
LEAK_WORDS = ("held whole", "is shared by", "free")
PPU = "alibabacloud.com/ppu"


async def _until(cond: Callable[[], bool], within_s: float = 10.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"{what or 'condition'} not met"
        await asyncio.sleep(0.02)


def _pod(name: str, containers: dict[str, dict[str, int]], *, uid: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "ns", "name": name, "uid": uid or uuid.uuid4().hex},
        "spec": {
            "containers": [
                {"name": c, "resources": {"limits": {r: str(n) for r, n in res.items()}}}
                for c, res in containers.items()
            ]
        },
        "status": {"phase": "Running"},
    }


class Node:
    """The emulated node: its pods, and what the Runtime should hold for them."""

    def __init__(self, kubelet: KubeletEmulator, sim: Simulator) -> None:
        self.kubelet = kubelet
        self.sim = sim
        self.pods: dict[str, dict[str, Any]] = {}

    def publish(self) -> None:
        self.kubelet.set_pods(list(self.pods.values()))

    async def run(self, pod: dict[str, Any]) -> None:
        self.pods[pod["metadata"]["name"]] = pod
        self.publish()
        await self.kubelet.admit(pod)

    def delete(self, name: str) -> None:
        del self.pods[name]
        self.publish()

    def end(self, name: str, phase: str = "Failed") -> None:
        self.pods[name]["status"]["phase"] = phase

    def expected(self) -> set[tuple[str, str, tuple[str, ...]]]:
        """(pod uid, container, devices) of every live container's allocation."""
        live = {
            p["metadata"]["uid"] for p in self.pods.values() if p["status"]["phase"] == "Running"
        }
        return {
            (r.pod_uid or "", r.container or "", tuple(sorted(r.device_ids)))
            for r in self.kubelet.allocations
            if r.pod_uid in live
        }

    def held(self) -> set[tuple[str, str, tuple[str, ...]]]:
        return {
            (a.pod.uid, a.container, tuple(sorted(a.device_ids))) for a in self.sim.allocations()
        }


def _settings(k: KubeletEmulator, sim: Simulator, *extra: str) -> Any:
    return load(
        [
            "--socket-dir",
            str(sim.socket_dir),
            "--plugin-dir",
            k.plugin_dir,
            "--port",
            "0",
            "--node-name",
            "emulated-node",
            "--pods-source",
            "kubelet",
            "--kubelet-pods-url",
            k.pods_url,
            "--pod-resources-socket",
            k.pod_resources_socket,
            "--reconcile-interval",
            "0.2",
            "--release-grace",
            "0.3",
            "--publish-inventory",
            "false",
            *extra,
        ],
        {},
    )


class Daemon:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(serve(self.settings, self.stop))

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)
            self.task = None


@pytest_asyncio.fixture
async def node(
    request: Any, kubelet_emulator: KubeletEmulator, runtime_sim_factory: Any
) -> AsyncIterator[tuple[Node, Daemon]]:
    sim = await runtime_sim_factory(getattr(request, "param", "mig-tdm"))
    daemon = Daemon(_settings(kubelet_emulator, sim))
    await daemon.start()
    try:
        yield Node(kubelet_emulator, sim), daemon
    finally:
        await daemon.halt()


async def _registered(n: Node, *resources: str) -> None:
    def ready(r: str) -> bool:
        e = n.kubelet.endpoints.get(r)
        return e is not None and e.connected and bool(e.devices)

    await _until(lambda: all(ready(r) for r in resources), what="registration")


async def test_the_same_gpus_serve_pod_after_pod_and_leaks_are_released(
    node: tuple[Node, Daemon],
) -> None:
    """Before: the second pod's Allocate failed with "gpu-N is held whole by alloc-000001"."""
    n, _ = node
    await _registered(n, GPU)
    whole = len(n.kubelet.devices(GPU))
    for i in range(6):
        await n.run(_pod(f"p{i}", {"main": {GPU: whole}}))
        assert n.kubelet.failures == []
        held = n.sim.allocations()
        assert [a.pod.name for a in held] == [f"p{i}"], held
        # every allocation carries its pod and container, not a placeholder
        assert held[0].container == "main"
        n.delete(f"p{i}") if i % 2 else n.end(f"p{i}")
    await _until(lambda: n.sim.allocations() == [], what="release of the last pod")


async def test_nothing_is_released_while_the_kubelet_or_runtime_does_not_answer(
    node: tuple[Node, Daemon],
) -> None:
    n, _ = node
    await _registered(n, GPU)
    await n.run(_pod("a", {"main": {GPU: 1}}))
    await n.run(_pod("b", {"main": {GPU: 1}}))
    assert len(n.sim.allocations()) == 2
    await n.kubelet.pod_resources.stop()  # a kubelet restarting
    n.delete("a")
    await asyncio.sleep(1.5)  # many intervals and grace periods
    assert len(n.sim.allocations()) == 2
    await n.kubelet.pod_resources.start()
    await _until(lambda: n.held() == n.expected(), what="release once the kubelet answers")
    await n.sim.stop()  # a Runtime upgrade window
    n.delete("b")
    await asyncio.sleep(1.0)
    await n.sim.start()
    assert len(n.sim.allocations()) == 1
    await _until(lambda: n.sim.allocations() == [], what="release once the Runtime answers")


async def test_a_pod_replaced_under_the_same_name_does_not_keep_the_old_allocation(
    node: tuple[Node, Daemon],
) -> None:
    n, _ = node
    await _registered(n, GPU)
    await n.run(_pod("web", {"main": {GPU: 1}}, uid="uid-old"))
    n.delete("web")
    await n.run(_pod("web", {"main": {GPU: 1}}, uid="uid-new"))
    await _until(lambda: n.held() == n.expected(), what="only the new pod's allocation")
    assert {a.pod.uid for a in n.sim.allocations()} == {"uid-new"}


async def test_same_shaped_pods_at_once_are_reowned_from_pod_resources(
    node: tuple[Node, Daemon],
) -> None:
    """Two pods of another scheduler asking one GPU each, both pending: the plugin cannot tell
    whose Allocate it is, allocates under a provisional owner and re-owns from pod-resources."""
    n, _ = node
    await _registered(n, GPU)
    a, b = _pod("a", {"main": {GPU: 1}}), _pod("b", {"main": {GPU: 1}})
    n.pods.update(a=a, b=b)
    n.publish()
    await n.kubelet.admit(a)
    await n.kubelet.admit(b)
    await _until(lambda: n.held() == n.expected(), what="re-owned to the real pods")
    assert {x.pod.name for x in n.sim.allocations()} == {"a", "b"}


async def test_an_older_runtime_keeps_the_provisional_owner_and_still_releases(
    node: tuple[Node, Daemon],
) -> None:
    n, _ = node
    n.sim.set_capabilities(
        c for c in n.sim.faults.capabilities if c != "DeviceService.UpdateAllocationOwner"
    )
    await _registered(n, GPU)
    a, b = _pod("a", {"main": {GPU: 1}}), _pod("b", {"main": {GPU: 1}})
    n.pods.update(a=a, b=b)
    n.publish()
    await n.kubelet.admit(a)
    await n.kubelet.admit(b)
    await asyncio.sleep(1.0)
    assert {x.pod.namespace for x in n.sim.allocations()} == {"lj-runtimekit-unattributed"}
    n.delete("a")
    n.delete("b")
    await _until(lambda: n.sim.allocations() == [], what="release of provisional allocations")


@pytest.mark.parametrize(
    ("node", "resource"),
    [("mig-tdm", GPU), ("ppu-8x", PPU), ("gpu-8x-nvlink", GPU)],
    ids=["partitions-and-whole", "ppu", "whole-gpu"],
    indirect=["node"],
)
async def test_many_pods_through_the_same_devices_with_restarts_at_random(
    node: tuple[Node, Daemon], resource: str
) -> None:
    n, daemon = node
    rng = random.Random(18)
    await _registered(n, resource)
    total = {resource: len(n.kubelet.devices(resource))}
    for i in range(40):
        free = total[resource] - sum(
            int(c["resources"]["limits"].get(resource, 0))
            for p in n.pods.values()
            if p["status"]["phase"] == "Running"
            for c in p["spec"]["containers"]
        )
        if free > 0:
            seen = len(n.kubelet.failures)
            await n.run(_pod(f"p{i}", {"main": {resource: rng.randint(1, min(free, 2))}}))
            # Allocate waits for a restarting Runtime: no admission fails
            assert len(n.kubelet.failures) == seen, n.kubelet.failures[seen:]
        running = [k for k, p in n.pods.items() if p["status"]["phase"] == "Running"]
        if running and rng.random() < 0.5:
            victim = rng.choice(running)
            n.delete(victim) if rng.random() < 0.5 else n.end(
                victim, rng.choice(["Failed", "Succeeded"])
            )
        roll = rng.random()
        if roll < 0.08:
            await daemon.halt()
            # the kubelet notices the plugin gone (its stream ends) before the new one registers;
            # otherwise the old endpoint still reads as registered
            await _until(lambda: not n.kubelet.endpoints[resource].connected, what="plugin gone")
            await daemon.start()
            await _registered(n, resource)
        elif roll < 0.16:
            await n.sim.restart()
        elif roll < 0.24:
            await n.kubelet.restart()
            await _registered(n, resource)
        leaks = [f for f in n.kubelet.failures if any(w in f[3] for w in LEAK_WORDS)]
        assert leaks == [], leaks
        # never two containers on one whole device
        ids = [d for a in n.sim.allocations() for d in a.device_ids]
        assert len(ids) == len(set(ids)), ids
    await _until(lambda: n.held() == n.expected(), within_s=10, what="Runtime == live containers")
