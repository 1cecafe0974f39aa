"""A node changing mode with GPU pods running, against the runtime simulator over its sockets
(docs/dra.md, "Migrating a node without disturbing running pods").

Mode dra: the reconciler releases a device-plugin pod's allocation once the pod is gone, never a
prepared claim's, and the handover names the GPU the old pod holds (tainted in the slices).
Mode device-plugin after mode dra: the reconciler leaves the claims' allocations alone, their
devices are Unhealthy in ListAndWatch, the kubelet's DRA API answers a repeated prepare and
refuses a new one, and its unprepare releases; the DRA sockets then go and the devices come
back. The kubelet's pod-resources answer is a small fake (its real one is in the real-node
test); claims are the apiserver's JSON as in test_dra_prepare_with_runtime_sim."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.deviceplugin.server import DevicePlugin
from lj_runtimekit_device_plugin.dra.checkpoint import CheckpointStore, read_boot_id
from lj_runtimekit_device_plugin.dra.offers import device_names
from lj_runtimekit_device_plugin.dra.plan import ClaimRef
from lj_runtimekit_device_plugin.dra.plugin import DraHost
from lj_runtimekit_device_plugin.dra.prepare import Preparer
from lj_runtimekit_device_plugin.handover import Handover
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.modes.migration import hand_back, tracker
from lj_runtimekit_device_plugin.node import ours
from lj_runtimekit_device_plugin.reclaim import Reclaimer
from lj_runtimekit_device_plugin.reconcile import Holding
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.dra.v1 import api_pb2 as dra_pb2
from lj_runtimekit_interface.dra.v1 import api_pb2_grpc as dra_grpc
from lj_runtimekit_testkit.kubelet import KubeletEmulator

GPU = "aliyun.com/gpu"
DRIVER, NODE, KIND, BOOT = "lj-runtimekit.aliyun.com", "node-a", "aliyun.com/gpu", "boot-1"
NAMES = ResourceNames()


def claim(name: str, uid: str, devices: list[str], *, pod: str, pool: str = NODE) -> dict[str, Any]:
    """A claim as the scheduler writes it: allocated here, reserved for ``pod``."""
    results = [{"request": "gpus", "driver": DRIVER, "pool": pool, "device": d} for d in devices]
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"{pod}-uid"}],
        },
    }


class Apiserver:
    """The claims and pods the preparer reads."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def claim(self, ns: str, name: str) -> dict[str, Any]:
        return self.objects["claim", ns, name]

    async def pod(self, ns: str, name: str) -> dict[str, Any]:
        return self.objects["pod", ns, name]

    def add(self, c: dict[str, Any]) -> ClaimRef:
        meta = c["metadata"]
        self.objects["claim", "ns", meta["name"]] = c
        pod = c["status"]["reservedFor"][0]["name"]
        self.objects["pod", "ns", pod] = {
            "metadata": {"namespace": "ns", "name": pod},
            "spec": {
                "resourceClaims": [{"name": "gpus", "resourceClaimName": meta["name"]}],
                "containers": [{"name": "main", "resources": {"claims": [{"name": "gpus"}]}}],
            },
        }
        return ClaimRef("ns", meta["name"], meta["uid"])


class PodResources:
    """The kubelet's pod-resources List: what the test says each container holds."""

    def __init__(self) -> None:
        self.holdings: list[Holding] = []

    async def list(self, resources: frozenset[str] | None = None) -> list[Holding]:
        return list(self.holdings)

    async def close(self) -> None:
        pass


@dataclass
class Rig:
    client: RuntimeClient
    devices: list[Device]
    names: dict[str, str]
    api: Apiserver
    kubelet: PodResources
    tmp: Path

    def preparer(self) -> Preparer:
        return Preparer(
            self.client,
            read_claim=self.api.claim,
            read_pod=self.api.pod,
            devices=lambda: self.devices,
            store=CheckpointStore(self.tmp / "plugins" / DRIVER / "checkpoint.json", BOOT),
            names=NAMES,
            driver=DRIVER,
            pool=NODE,
            cdi_dir=self.tmp / "cdi",
            cdi_kind=KIND,
        )

    def host(self, preparer: Preparer, *, dra: bool, unprepared: asyncio.Event) -> DraHost:
        return DraHost(
            preparer,
            driver=DRIVER,
            plugin_dir=str(self.tmp / "plugins"),
            registry_dir=str(self.tmp / "registry"),
            prepare=dra,
            on_unprepared=unprepared.set,
        )

    def reclaimer(self, host: DraHost, handover: Handover, *, dra: bool) -> Reclaimer:
        return Reclaimer(
            self.client,
            self.kubelet,  # type: ignore[arg-type]
            ours(NAMES),
            frozenset({NAMES.gpu_core, NAMES.gpu_memory}),
            grace_s=0.0,
            interval_s=3600,
            claimed=host.plugin.settled,
            on_listed=tracker(handover, lambda: self.devices, dra=dra),
        )


@pytest.fixture
async def rig(runtime_sim: Any, kubelet_dir: Path) -> AsyncIterator[Rig]:
    client = RuntimeClient(str(runtime_sim.socket_dir), 5.0)
    devices = await client.list_devices()
    names = device_names(devices)
    # the DRA socket goes under it: a parallel worker's tmp_path is too long for a unix socket
    yield Rig(client, devices, names, Apiserver(), PodResources(), kubelet_dir)
    await client.close()


async def _until(cond: Callable[[], bool], within_s: float = 30.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"{what or 'condition'} not met"
        await asyncio.sleep(0.02)


async def _device_plugin_pod(rig: Rig, gpu: str) -> str:
    """A pod allocated through the device plugin API before the switch; its allocation id."""
    a = await rig.client.allocate(
        pod=("ns", "old", "old-uid"), container="main", resource=GPU, device_ids=[gpu]
    )
    rig.kubelet.holdings.append(Holding("ns", "old", "main", GPU, (gpu,)))
    return a.id


async def _prepared_claim(rig: Rig, preparer: Preparer, gpu: str) -> ClaimRef:
    ref = rig.api.add(claim("c", "uid-c", [rig.names[gpu]], pod="p"))
    out = await preparer.prepare([ref])
    assert not out[ref.uid].error, out[ref.uid].error
    # pod-resources lists a claim's devices under dynamic_resources, not devices
    rig.kubelet.holdings.append(Holding("ns", "p", "main", "", ()))
    return ref


async def test_mode_dra_releases_an_ended_device_plugin_pod_and_never_a_claim(
    runtime_sim: Any, rig: Rig
) -> None:
    old = await _device_plugin_pod(rig, "gpu-0")
    preparer = rig.preparer()
    ref = await _prepared_claim(rig, preparer, "gpu-1")
    (claim_alloc,) = preparer.checkpoint.claims[ref.uid].allocation_ids
    handover = Handover()
    reclaimer = rig.reclaimer(
        rig.host(preparer, dra=True, unprepared=asyncio.Event()), handover, dra=True
    )
    for _ in range(3):
        result = await reclaimer.reconcile()
        assert not result.skipped, result.skipped
        assert result.released == ()
    assert handover.known.is_set()
    assert handover.held == {"gpu-0": ("ns", "old", "old-uid")}  # tainted in the slices
    rig.kubelet.holdings = [h for h in rig.kubelet.holdings if h.name != "old"]  # the pod ends
    released: list[str] = []
    for _ in range(2):
        released += (await reclaimer.reconcile()).released
    assert released == [old]
    assert handover.held == {}  # the taint goes
    assert [a.id for a in runtime_sim.allocations()] == [claim_alloc]


async def test_mode_device_plugin_after_dra_serves_unprepare_only_and_withholds_the_claims_gpu(
    runtime_sim: Any, rig: Rig
) -> None:
    await _device_plugin_pod(rig, "gpu-0")
    ref = await _prepared_claim(rig, rig.preparer(), "gpu-1")
    # the node is relabelled: a new process in mode device-plugin, the same checkpoint
    preparer = rig.preparer()
    unprepared = asyncio.Event()
    host = rig.host(preparer, dra=False, unprepared=unprepared)
    handover = Handover()
    reclaimer = rig.reclaimer(host, handover, dra=False)
    inventory = Inventory()
    await inventory.replace(rig.devices)
    plugin = DevicePlugin(GPU, inventory, NAMES, allocator=None, withheld=handover)  # type: ignore[arg-type]
    reconciling = asyncio.create_task(reclaimer.run())
    back = asyncio.create_task(hand_back(host, unprepared, reclaimer.wake))
    stream = plugin.ListAndWatch(None, None).__aiter__()  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(handover.known.wait(), 10)
        assert handover.held == {"gpu-1": ("ns", "p", "p-uid")}
        health = {d.ID: d.health for d in (await anext(stream)).devices}
        assert health["gpu-1"] == sockets.UNHEALTHY
        assert health["gpu-0"] == health["gpu-2"] == sockets.HEALTHY
        for _ in range(3):
            assert (await reclaimer.reconcile()).released == ()
        assert len(runtime_sim.allocations()) == 2
        await _until(host.dra_socket.exists, what="the DRA socket")
        allocations_made = runtime_sim.calls("Allocate")
        async with grpc.aio.insecure_channel(sockets.unix_target(str(host.dra_socket))) as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            new = rig.api.add(claim("n", "uid-n", [rig.names["gpu-2"]], pod="q"))
            got = await stub.NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(
                    claims=[
                        dra_pb2.Claim(namespace="ns", name=r.name, uid=r.uid) for r in (ref, new)
                    ]
                )
            )
            assert "device-plugin mode" in got.claims[new.uid].error
            assert not got.claims[ref.uid].error  # a repeat (a kubelet restart): same answer
            assert got.claims[ref.uid].devices[0].device_name == rig.names["gpu-1"]
            assert runtime_sim.calls("Allocate") == allocations_made
            done = await stub.NodeUnprepareResources(
                dra_pb2.NodeUnprepareResourcesRequest(
                    claims=[dra_pb2.Claim(namespace="ns", name=ref.name, uid=ref.uid)]
                )
            )
            assert not done.claims[ref.uid].error
        assert [a.pod.name for a in runtime_sim.allocations()] == ["old"]
        assert not preparer.spec_path(ref.uid).exists()
        await asyncio.wait_for(back, 10)  # no claim left: the DRA sockets go
        assert not host.dra_socket.exists()
        assert not host.reg_socket.exists()
        health = {d.ID: d.health for d in (await asyncio.wait_for(anext(stream), 10)).devices}
        assert health["gpu-1"] == sockets.HEALTHY
    finally:
        reconciling.cancel()
        back.cancel()
        await host.stop()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="dra-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_the_daemon_back_in_device_plugin_mode_withholds_then_returns_a_claims_gpu(
    runtime_sim: Any, rig: Rig, kubelet_emulator: KubeletEmulator, short_dir: Path
) -> None:
    """The whole daemon, started in mode device-plugin on a node whose DRA checkpoint (this boot)
    holds a claim: the kubelet sees the claim's GPU Unhealthy, the DRA sockets serve, and the
    kubelet's unprepare releases it, gives the GPU back and withdraws the sockets."""
    preparer = Preparer(
        rig.client,
        read_claim=rig.api.claim,
        read_pod=rig.api.pod,
        devices=lambda: rig.devices,
        store=CheckpointStore(short_dir / "plugins" / DRIVER / "checkpoint.json", read_boot_id()),
        names=NAMES,
        driver=DRIVER,
        pool="emulated-node",
        cdi_dir=short_dir / "cdi",
        cdi_kind=KIND,
    )
    ref = rig.api.add(claim("c", "uid-c", [rig.names["gpu-1"]], pod="p", pool="emulated-node"))
    assert not (await preparer.prepare([ref]))[ref.uid].error
    k = kubelet_emulator
    s = load(
        [
            *("--socket-dir", str(runtime_sim.socket_dir), "--plugin-dir", k.plugin_dir),
            *("--port", "0", "--node-name", "emulated-node", "--pods-source", "kubelet"),
            *("--kubelet-pods-url", k.pods_url, "--pod-resources-socket", k.pod_resources_socket),
            *("--reconcile-interval", "0.2", "--release-grace", "0.3"),
            *("--publish-inventory", "false", "--dra-plugin-dir", str(short_dir / "plugins")),
            *(
                "--dra-registry-dir",
                str(short_dir / "registry"),
                "--cdi-dir",
                str(short_dir / "cdi"),
            ),
        ],
        {},
    )
    stop = asyncio.Event()
    daemon = asyncio.create_task(serve(s, stop))
    dra_socket = short_dir / "plugins" / DRIVER / "dra.sock"
    try:
        await _until(lambda: len(k.devices(GPU)) == 8, what="the GPUs registered")
        assert k.devices(GPU)["gpu-1"] == sockets.UNHEALTHY
        assert sum(h == sockets.HEALTHY for h in k.devices(GPU).values()) == 7
        await _until(dra_socket.exists, what="the DRA socket")
        assert (short_dir / "registry" / f"{DRIVER}-reg.sock").exists()
        await asyncio.sleep(1.0)  # several reconcile passes: the claim's allocation stays
        assert [a.pod.name for a in runtime_sim.allocations()] == ["p"]
        async with grpc.aio.insecure_channel(sockets.unix_target(str(dra_socket))) as ch:
            done = await dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                dra_pb2.NodeUnprepareResourcesRequest(
                    claims=[dra_pb2.Claim(namespace="ns", name=ref.name, uid=ref.uid)]
                )
            )
        assert not done.claims[ref.uid].error
        assert runtime_sim.allocations() == []
        await _until(lambda: k.devices(GPU)["gpu-1"] == sockets.HEALTHY, what="gpu-1 back")
        await _until(lambda: not dra_socket.exists(), what="the DRA socket withdrawn")
    finally:
        stop.set()
        await asyncio.wait_for(daemon, 10)
