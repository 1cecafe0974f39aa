"""Exporter benchmark: scrape latency and CPU per scrape, render cost per snapshot, RSS.

    components/exporter/bench/run.py --out build/bench [--scrapes 300]

The exporter runs as its own process (`python -m lj_runtimekit_exporter`) against the runtime
simulator (in this process) with 8 or 64 GPUs and 100 or 300 containers sharing them; scrapes
go over real HTTP. CPU per scrape is the exporter process's CPU time during the scrapes, less
what it spends in the same wall time without scrapes (its background poll). The render cost of
a fresh snapshot (the first scrape after a poll) is measured in this process and compared with
client_python's own ``generate_latest`` over the same data (the anchor).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lj_runtimekit_exporter.collector import Exposition, State, all_families
from lj_runtimekit_exporter.runtime import RuntimeClient
from lj_runtimekit_exporter.snapshot import Snapshot
from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc
from lj_runtimekit_testkit.bench import Figure, write
from lj_runtimekit_testkit.simulator.simulator import Simulator

SCENARIOS = ((8, 100), (64, 100), (64, 300))
TICKS = os.sysconf("SC_CLK_TCK")


def inventory_yaml(n: int) -> str:
    devices = "\n".join(
        f"  - {{id: gpu-{i}, uuid: GPU-bench-{i:04d}, numa_node: {i * 2 // n}, "
        f'pci_bus_id: "0000:{i:02x}:00.0"}}'
        for i in range(n)
    )
    groups = "\n".join(
        f"  - {{type: nvlink, devices: [{', '.join(f'gpu-{j}' for j in range(g, g + 8))}], "
        "bandwidth_gbps: 200, lanes: 8}"
        for g in range(0, n, 8)
    )
    return (
        "version: v1\nnode: bench-node\nruntime_version: v1.13.0\n"
        "control_device_nodes: [/dev/nvidiactl]\n"
        "defaults: {kind: gpu, vendor: NVIDIA, model: NVIDIA H800, memory_gib: 80, "
        "compute_units: 132, supports: [mig, tdm]}\n"
        f"devices:\n{devices}\ntopology:\n{groups}\n"
    )


async def allocate_shared(sim: Simulator, devices: int, containers: int) -> None:
    core = max(1, 100 // -(-containers // devices))
    async with grpc.aio.insecure_channel(sim.target("DeviceService")) as ch:
        stub = device_pb2_grpc.DeviceServiceStub(ch)
        for i in range(containers):
            await stub.Allocate(
                device_pb2.AllocateRequest(
                    pod=device_pb2.PodRef(namespace="bench", name=f"pod-{i}", uid=f"uid-{i}"),
                    container="main",
                    resource_name="aliyun.com/gpu-core",
                    device_ids=[f"gpu-{i % devices}"],
                    core_percent=core,
                    memory_bytes=2**28,
                )
            )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ready(session: aiohttp.ClientSession, url: str, devices: int) -> None:
    end = time.monotonic() + 30
    needle = f'device="gpu-{devices - 1}"'
    while time.monotonic() < end:
        try:
            async with session.get(url) as r:
                if needle in await r.text() and 'pod="pod-' in await r.text():
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("exporter did not serve the simulator's devices in 30 s")


class ClientPython(Collector):
    """The same families through client_python's own exposition (the anchor)."""

    def __init__(self, state: State) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        return (f.build() for f in all_families(self.state, time.time()))

    def describe(self) -> Iterator[Metric]:
        return iter(())


async def render_cost(sim: Simulator, rounds: int = 20) -> tuple[float, float]:
    """CPU seconds to render one fresh snapshot: ours, and client_python's generate_latest."""
    async with RuntimeClient(str(sim.socket_dir), 5.0) as client:
        rt = await client.read(await client.version())
    state = State(node="bench", pods_source="none", max_age=1e9)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientPython(state))
    exposition = Exposition(state)
    ours, theirs = [], []
    for _ in range(rounds):
        state.snapshot = Snapshot("bench", time.time(), rt, None)
        t = time.process_time()
        exposition.body(openmetrics=False)
        ours.append(time.process_time() - t)
        t = time.process_time()
        generate_latest(registry)
        theirs.append(time.process_time() - t)
    return statistics.median(ours), statistics.median(theirs)


async def scenario(devices: int, containers: int, scrapes: int) -> list[Figure]:
    tag = f"{devices}dev_{containers}ctr"
    with tempfile.TemporaryDirectory(prefix="ljbench-") as tmp:
        inv = Path(tmp) / "inventory.yaml"
        inv.write_text(inventory_yaml(devices))
        sim = Simulator(Path(tmp) / "s", inv)
        await sim.start()
        port = free_port()
        flags = {
            "--socket-dir": str(sim.socket_dir),
            "--metrics-bind-address": f"127.0.0.1:{port}",
            "--pods-source": "none",
            "--node-name": "bench",
            "--log-level": "warning",
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lj_runtimekit_exporter",
            *(x for kv in flags.items() for x in kv),
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await allocate_shared(sim, devices, containers)
            url = f"http://127.0.0.1:{port}/metrics"
            async with aiohttp.ClientSession() as session:
                await wait_ready(session, url, devices)
                idle_rss = rss_mib(proc.pid)
                latencies: list[float] = []
                cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
                for _ in range(scrapes):
                    t = time.perf_counter()
                    async with session.get(url) as r:
                        body = await r.read()
                    latencies.append(time.perf_counter() - t)
                cpu_busy, wall = cpu_seconds(proc.pid) - cpu0, time.monotonic() - wall0
                cpu1 = cpu_seconds(proc.pid)
                await asyncio.sleep(wall)
                cpu_idle = cpu_seconds(proc.pid) - cpu1
                loaded_rss = rss_mib(proc.pid)
            ours, anchor = await render_cost(sim)
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
            await sim.stop()
    q = statistics.quantiles(latencies, n=100)
    per_scrape = max(cpu_busy - cpu_idle, 0.0) / scrapes
    return [
        Figure(f"scrape_latency_p50_{tag}", statistics.median(latencies) * 1e3, "ms"),
        Figure(f"scrape_latency_p99_{tag}", q[98] * 1e3, "ms"),
        Figure(f"scrape_cpu_per_scrape_{tag}", per_scrape * 1e3, "ms"),
        Figure(
            f"render_cpu_per_fresh_snapshot_{tag}",
            ours * 1e3,
            "ms",
            anchor=anchor * 1e3,
            anchor_name="prometheus_client generate_latest",
        ),
        Figure(f"exposition_size_{tag}", len(body) / 1024, "KiB"),
        Figure(f"rss_idle_{tag}", idle_rss, "MiB"),
        Figure(f"rss_loaded_{tag}", loaded_rss, "MiB"),
    ]


async def main_async(out: Path, scrapes: int) -> None:
    figures: list[Figure] = []
    for devices, containers in SCENARIOS:
        figures += await scenario(devices, containers, scrapes)
    path = write(out, "exporter", figures)
    for f in figures:
        extra = f"  (anchor {f.anchor:.3g}, ratio {f.ratio:.2f})" if f.ratio is not None else ""
        print(f"{f.name:<48} {f.value:>10.3f} {f.unit}{extra}")
    print(f"wrote {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, required=True, help="folder for exporter.json")
    p.add_argument("--scrapes", type=int, default=300, help="scrapes per scenario (default 300)")
    args = p.parse_args()
    asyncio.run(main_async(args.out, args.scrapes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
