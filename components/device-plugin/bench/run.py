"""Benchmarks of the device plugin: ``python components/device-plugin/bench/run.py --out DIR``.

Measured through real gRPC channels on unix sockets:
- GetPreferredAllocation p50/p99 on 8 and 16 GPUs (NVLink islands of 4 and 8; random free sets);
- Allocate p50/p99 for one whole GPU against the in-process runtime simulator;
- health event → the ListAndWatch stream showing it, p50/p99;
- release latency after a pod is deleted (reconcile interval and grace 0.5 s), p50/p99;
- one reconcile pass on a node with 100 allocations (Runtime ListAllocations, kubelet
  pod-resources List and /pods, all held), p50/p99;
- one pod-resources List of 100 pods, p50/p99 (the kubelet emulator's server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from lj_runtimekit_device_plugin.deviceplugin.allocate import Allocator
from lj_runtimekit_device_plugin.deviceplugin.server import DevicePlugin, create_server
from lj_runtimekit_device_plugin.health import HealthFollower
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.kubelet import PodResourcesClient, kubelet_pods
from lj_runtimekit_device_plugin.model import GIB, Device, Link
from lj_runtimekit_device_plugin.node import ours
from lj_runtimekit_device_plugin.podview import pod_state, pod_view
from lj_runtimekit_device_plugin.reclaim import Reclaimer
from lj_runtimekit_device_plugin.reconcile import PodState
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient, allocation_ids
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.deviceplugin.v1beta1.api_pb2 import ContainerAllocateResponse
from lj_runtimekit_testkit.bench import Figure, write
from lj_runtimekit_testkit.kubelet.emulator import AllocationRecord, KubeletEmulator
from lj_runtimekit_testkit.simulator import Simulator

NAMES = ResourceNames()
ROUNDS = 300


def _node(n: int, island: int) -> list[Device]:
    out = []
    for i in range(n):
        base = i - i % island
        links = tuple(Link(f"gpu-{j}", "nvlink") for j in range(base, base + island) if j != i)
        out.append(
            Device(id=f"gpu-{i}", index=i, memory_bytes=80 * GIB, numa_node=i * 2 // n, links=links)
        )
    return out


def _pcts(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49] * 1e3, q[98] * 1e3


async def _refuse(resource: str, ids: object) -> list[object]:
    raise RuntimeError("not used")


async def _serve(plugin: DevicePlugin, d: Path) -> tuple[grpc.aio.Server, grpc.aio.Channel, str]:
    path = str(d / f"bench-{id(plugin)}.sock")
    server = create_server(sockets.unix_target(path), plugin)
    await server.start()
    return server, grpc.aio.insecure_channel(sockets.unix_target(path)), path


async def preferred_latency(n: int, island: int, d: Path) -> list[Figure]:
    inv = Inventory()
    await inv.replace(_node(n, island))
    plugin = DevicePlugin(NAMES.gpu, inv, NAMES, _refuse)  # type: ignore[arg-type]
    server, ch, _ = await _serve(plugin, d)
    stub = api_pb2_grpc.DevicePluginStub(ch)
    rng = random.Random(n)
    samples = []
    for _ in range(ROUNDS):
        free = rng.sample([f"gpu-{i}" for i in range(n)], rng.randint(1, n))
        size = rng.randint(1, len(free))
        req = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=free, allocation_size=size
                )
            ]
        )
        t = time.perf_counter()
        await stub.GetPreferredAllocation(req)
        samples.append(time.perf_counter() - t)
    await ch.close()
    await server.stop(None)
    p50, p99 = _pcts(samples)
    return [
        Figure(f"GetPreferredAllocation p50, {n} GPUs", p50, "ms"),
        Figure(f"GetPreferredAllocation p99, {n} GPUs", p99, "ms"),
    ]


async def runtime_figures(d: Path) -> list[Figure]:
    sim = Simulator(tempfile.mkdtemp(prefix="sim-", dir=d), "gpu-8x-nvlink")
    await sim.start()
    client = RuntimeClient(str(sim.socket_dir))
    inv = Inventory()
    follower = HealthFollower(client, inv, 60.0)
    watch = asyncio.create_task(follower.watch())
    await asyncio.wait_for(follower.connected.wait(), 10)
    plugin = DevicePlugin(NAMES.gpu, inv, NAMES, Allocator(client, NAMES, 10.0))
    server, ch, _ = await _serve(plugin, d)
    stub = api_pb2_grpc.DevicePluginStub(ch)
    alloc = []
    for k in range(ROUNDS // 3):
        req = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"gpu-{k % 8}"])]
        )
        t = time.perf_counter()
        await stub.Allocate(req)
        alloc.append(time.perf_counter() - t)
        # no release by hand: the next Allocate of the device frees the stale holder itself
    health = []
    call = stub.ListAndWatch(api_pb2.Empty())
    await call.read()
    for k in range(60):
        t = time.perf_counter()
        sim.set_health("gpu-5", k % 2 == 1, "bench flip")
        await call.read()
        health.append(time.perf_counter() - t)
    call.cancel()
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch
    await ch.close()
    await server.stop(None)
    await client.close()
    await sim.stop()
    a50, a99 = _pcts(alloc)
    h50, h99 = _pcts(health)
    return [
        Figure("Allocate p50, 1 whole GPU of 8 (simulator)", a50, "ms"),
        Figure("Allocate p99, 1 whole GPU of 8 (simulator)", a99, "ms"),
        # each Allocate above also lists the Runtime's allocations and releases the stale one
        Figure("health event to ListAndWatch p50", h50, "ms"),
        Figure("health event to ListAndWatch p99", h99, "ms"),
    ]


def _held_pod(k: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "bench", "name": f"p{k}", "uid": f"uid-{k}"},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def _record(k: int, resource: str, ids: tuple[str, ...]) -> AllocationRecord:
    return AllocationRecord(
        resource,
        ids,
        ContainerAllocateResponse(),
        pod_uid=f"uid-{k}",
        pod=f"bench/p{k}",
        container="main",
    )


async def lifecycle_figures(d: Path) -> list[Figure]:
    sim = Simulator(tempfile.mkdtemp(prefix="sim-", dir=d), "gpu-8x-nvlink")
    await sim.start()
    emu = KubeletEmulator("bench-node", tempfile.mkdtemp(prefix="kubelet-", dir=d))
    await emu.start()
    client = RuntimeClient(str(sim.socket_dir))
    kubelet = PodResourcesClient(emu.pod_resources_socket)

    async def pods() -> list[PodState]:
        views = [pod_view(p) for p in await kubelet_pods(emu.pods_url)]
        return [pod_state(v) for v in views if v is not None]

    reclaimer = Reclaimer(
        client,
        kubelet,
        ours(NAMES),
        frozenset({NAMES.gpu_core, NAMES.gpu_memory}),
        pods=pods,
        interval_s=0.5,
        grace_s=0.5,
    )
    # 100 shared allocations of 1 % on 8 GPUs, each held by its pod
    live: list[dict[str, Any]] = []
    for k in range(100):
        gpu = f"gpu-{k % 8}"
        await client.allocate(
            pod=("bench", f"p{k}", f"uid-{k}"),
            container="main",
            resource=NAMES.gpu_core,
            device_ids=[gpu],
            core_percent=1,
            memory_bytes=GIB,
        )
        live.append(_held_pod(k))
        emu.allocations.append(_record(k, NAMES.gpu_core, (f"{gpu}::core-{k}",)))
    emu.set_pods(live)
    lists, passes = [], []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        await kubelet.list()
        lists.append(time.perf_counter() - t)
    for _ in range(60):
        result = await reclaimer.reconcile()
        if result.released or result.skipped:
            raise RuntimeError(f"a pass on a node where all is held released or skipped: {result}")
        passes.append(result.seconds)
    # release latency: a shared pod is deleted; how long until the Runtime frees its share
    task = asyncio.create_task(reclaimer.run())
    latency = []
    for k in range(100, 130):
        gpu = f"gpu-{k % 8}"
        a = await client.allocate(
            pod=("bench", f"p{k}", f"uid-{k}"),
            container="main",
            resource=NAMES.gpu_core,
            device_ids=[gpu],
            core_percent=1,
            memory_bytes=GIB,
        )
        emu.allocations.append(_record(k, NAMES.gpu_core, (f"{gpu}::core-{k % 100}",)))
        emu.set_pods([*live, _held_pod(k)])
        await asyncio.sleep(0.6)  # held, and past the grace period
        emu.set_pods(live)
        t = time.perf_counter()
        while a.id in await allocation_ids(client):  # noqa: ASYNC110 - polls the Runtime
            await asyncio.sleep(0.005)
        latency.append(time.perf_counter() - t)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await kubelet.close()
    await client.close()
    await emu.stop()
    await sim.stop()
    l50, l99 = _pcts(lists)
    p50, p99 = _pcts(passes)
    r50, r99 = _pcts(latency)
    return [
        Figure("release after pod deletion p50 (interval 0.5 s, grace 0.5 s)", r50, "ms"),
        Figure("release after pod deletion p99 (interval 0.5 s, grace 0.5 s)", r99, "ms"),
        Figure("reconcile pass p50, 100 allocations held", p50, "ms"),
        Figure("reconcile pass p99, 100 allocations held", p99, "ms"),
        Figure("pod-resources List p50, 100 pods", l50, "ms"),
        Figure("pod-resources List p99, 100 pods", l99, "ms"),
    ]


async def main_async(out: Path) -> None:
    # every socket and simulator state of the run under one directory, removed at the end
    # (each run left three directories in /tmp)
    with tempfile.TemporaryDirectory(prefix="ljdpb-") as tmp:
        d = Path(tmp)
        figures = await preferred_latency(8, 4, d)
        figures += await preferred_latency(16, 8, d)
        figures += await runtime_figures(d)
        figures += await lifecycle_figures(d)
    path = write(out, "device-plugin", figures)
    for f in figures:
        print(f"{f.name:<50} {f.value:10.3f} {f.unit}")
    print(f"written {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    asyncio.run(main_async(p.parse_args().out))


if __name__ == "__main__":
    main()
