"""The ``partition`` action and GPUs bound to vfio-pci (issue 22, item 2): the Runtime allocates
nothing for a GPU the device plugin gives to a VM pod as ``aliyun.com/gpu-vfio``, so before such a
GPU is unbound or repartitioned the agent asks the kubelet's pod-resources API who holds it.

Against the harness's runtime simulator and the kubelet emulator's pod-resources server
(``lj_runtimekit_testkit.kubelet.pod_resources``), each on its real unix socket; the GPUs' state is
read back through ListDevices."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_job_agent import app, result, settings
from lj_runtimekit_job_agent.partition_layout import from_yaml
from lj_runtimekit_testkit.kubelet.pod_resources import Held, PodResourcesServer, Snapshot
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.simulator import Simulator

VFIO_RESOURCE = "aliyun.com/gpu-vfio"
ALL_WHOLE = {f"gpu-{i}": "whole" for i in range(8)}
VFIO_6_7 = {**ALL_WHOLE, "gpu-6": "vfio", "gpu-7": "vfio"}
VM_ON_GPU_6 = "gpu-6 by vms/vm-a/compute (aliyun.com/gpu-vfio)"


def layout(yaml_text: str, name: str = "test-layout") -> str:
    return from_yaml(name, yaml_text).to_json()


ALL_WHOLE_LAYOUT = layout("[]", "all-whole")


@dataclass
class Kubelet:
    """The pods the pod-resources server reports; a test edits ``held`` as pods come and go.
    ``later``: reported instead from the ``after_calls``-th List on, counting from 1 (a pod given
    a GPU between two of the agent's questions)."""

    server: PodResourcesServer | None = None
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """pod name (namespace vms, container compute) → its vfio unit ids."""
    later: dict[str, tuple[str, ...]] | None = None
    after_calls: int = 0

    @property
    def socket_path(self) -> str:
        assert self.server is not None
        return self.server.socket_path

    def lists(self) -> int:
        assert self.server is not None
        return self.server.servicer.calls.get("List", 0)

    def snapshot(self) -> Snapshot:
        held = self.held
        if self.later is not None and self.lists() >= self.after_calls:
            held = self.later
        pods = [
            {
                "metadata": {"name": p, "namespace": "vms", "uid": f"uid-{p}"},
                "spec": {"containers": [{"name": "compute"}]},
            }
            for p in held
        ]
        # a container pod, holding the plain GPU resource: never a block for a vfio GPU
        pods.append(
            {
                "metadata": {"name": "train-0", "namespace": "team-a", "uid": "uid-train-0"},
                "spec": {"containers": [{"name": "main"}]},
            }
        )
        return Snapshot(
            pods=pods,
            held=[
                *(Held(f"uid-{p}", "compute", VFIO_RESOURCE, ids) for p, ids in held.items()),
                Held("uid-train-0", "main", "aliyun.com/gpu", ("gpu-6",)),
            ],
            numa={},
        )


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[Kubelet]:
    k = Kubelet()
    k.server = PodResourcesServer(str(tmp_path / "pod-resources"), k.snapshot)
    await k.server.start()
    try:
        yield k
    finally:
        await k.server.stop()


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    root.mkdir()
    return root


@pytest.fixture
async def gpu8(runtime_sim_factory: Any) -> AsyncIterator[tuple[Simulator, RuntimeClients]]:
    sim = await runtime_sim_factory(inventory="gpu-8x-nvlink")
    async with runtime_clients(sim) as clients:
        yield sim, clients


async def run(
    sim: Simulator, host: Path, layout_json: str, pod_resources: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    argv = [
        "partition",
        "--node-name=sim-node",
        f"--socket-dir={sim.socket_dir}",
        f"--layout={layout_json}",
        f"--host-root={host}",
        "--restart-command=false",
        "--confirm-command=false",
        "--containerd-socket=",
        f"--termination-log={host / 'termination-log'}",
        "--rpc-timeout=2",
        "--wait-for-release=0",
        f"--pod-resources-socket={pod_resources}",
        *extra,
    ]
    code, _ = await app.run_async(settings.load(argv, environ={}))
    written: dict[str, Any] = json.loads((host / "termination-log").read_text())
    return code, written


def _state(d: pb.Device) -> str:
    if d.binding == pb.DEVICE_BINDING_VFIO:
        return "vfio"
    if d.partition_mode == pb.PARTITION_MODE_MIG:
        return "mig " + "+".join(p.profile for p in d.partitions)
    return "whole" if d.partition_mode != pb.PARTITION_MODE_TDM else "tdm"


async def state(clients: RuntimeClients) -> dict[str, str]:
    reply = await clients.device.ListDevices(pb.ListDevicesRequest())
    return {d.id: _state(d) for d in reply.devices}


async def bind_6_and_7(sim: Simulator, host: Path, kubelet: Kubelet) -> None:
    """GPUs 6 and 7 to vfio-pci through the agent: neither is bound to vfio yet, so the kubelet
    is not asked."""
    code, res = await run(sim, host, layout("- {devices: [6, 7], vfio: true}"), kubelet.socket_path)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert kubelet.lists() == 0


async def test_a_vm_pod_on_a_vfio_gpu_blocks_its_unbinding_naming_the_pod(
    gpu8: tuple[Simulator, RuntimeClients], host: Path, kubelet: Kubelet
) -> None:
    sim, clients = gpu8
    await bind_6_and_7(sim, host, kubelet)
    kubelet.held = {"vm-a": ("gpu-6",)}

    code, res = await run(sim, host, ALL_WHOLE_LAYOUT, kubelet.socket_path)
    assert (code, res["reason"]) == (result.EXIT_BUSY, "AllocationsLive"), res
    assert res["blocked_by"] == [VM_ON_GPU_6]
    assert VM_ON_GPU_6 in res["message"]
    assert "nothing was changed" in res["message"]
    assert res["devices_changed"] == []
    assert await state(clients) == VFIO_6_7  # gpu-7 was free, and is untouched too
    assert kubelet.lists() >= 1

    # repartitioning it is a change as well
    code, res = await run(
        sim, host, layout("- {devices: [6], mig: [3g.40gb]}"), kubelet.socket_path
    )
    assert (code, res["blocked_by"]) == (result.EXIT_BUSY, [VM_ON_GPU_6]), res
    assert await state(clients) == VFIO_6_7


async def test_the_change_waits_for_the_vm_pod_and_converges_once_it_ends(
    gpu8: tuple[Simulator, RuntimeClients], host: Path, kubelet: Kubelet
) -> None:
    sim, clients = gpu8
    await bind_6_and_7(sim, host, kubelet)
    kubelet.held = {"vm-a": ("gpu-6",)}
    agent = asyncio.create_task(
        run(sim, host, ALL_WHOLE_LAYOUT, kubelet.socket_path, "--wait-for-release=60")
    )
    deadline = time.monotonic() + 30
    while kubelet.lists() < 1 and not agent.done():  # the agent has seen the VM pod
        assert time.monotonic() < deadline, "the agent never asked the kubelet"
        await asyncio.sleep(0.05)
    assert not agent.done()
    assert await state(clients) == VFIO_6_7  # waiting changes nothing, not even gpu-7
    kubelet.held = {}  # the VM pod ended
    code, res = await agent
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert res["devices_changed"] == ["gpu-6", "gpu-7"]
    assert res["blocked_by"] == []
    assert await state(clients) == ALL_WHOLE


def _stale_socket(path: Path) -> socket.socket:
    """A unix socket file nobody accepts on: a kubelet that died without removing it."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


@pytest.mark.parametrize("kind", ["missing", "stale"])
async def test_an_unreachable_pod_resources_socket_leaves_vfio_gpus_bound(
    gpu8: tuple[Simulator, RuntimeClients], host: Path, kubelet: Kubelet, kind: str
) -> None:
    sim, clients = gpu8
    await bind_6_and_7(sim, host, kubelet)
    path = host / "pod-resources" / "kubelet.sock"
    path.parent.mkdir()
    stale = _stale_socket(path) if kind == "stale" else None
    try:
        code, res = await run(sim, host, layout("- {devices: [0], mig: [3g.40gb]}"), str(path))
    finally:
        if stale is not None:
            stale.close()
    assert (code, res["reason"]) == (result.EXIT_BUSY, "AllocationsLive"), res
    assert "the agent cannot tell whether a VM uses gpu-6 or gpu-7" in res["message"]
    assert f"(pod-resources at {path} unreachable: " in res["message"]
    assert "nothing was changed" in res["message"]
    assert res["devices_changed"] == []
    # nothing changed: not the vfio GPUs, and not gpu-0 either (no half-applied layout)
    assert await state(clients) == VFIO_6_7
    assert sim.calls("SetPartitioning") == 0


async def test_a_layout_that_changes_only_gpus_on_the_driver_never_asks_the_kubelet(
    gpu8: tuple[Simulator, RuntimeClients], host: Path, kubelet: Kubelet
) -> None:
    sim, clients = gpu8
    await bind_6_and_7(sim, host, kubelet)
    kubelet.held = {"vm-a": ("gpu-6",)}  # the VM keeps its GPU: the layout keeps it on vfio
    keep = layout("- {devices: [0], mig: [3g.40gb]}\n- {devices: [6, 7], vfio: true}")
    code, res = await run(sim, host, keep, kubelet.socket_path)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert res["devices_changed"] == ["gpu-0"]
    assert await state(clients) == {**VFIO_6_7, "gpu-0": "mig 3g.40gb"}
    assert kubelet.lists() == 0
    # nor when there is no kubelet socket at all
    code, res = await run(sim, host, layout("- {devices: [6, 7], vfio: true}"), "/nonexistent.sock")
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == VFIO_6_7


async def test_a_vm_pod_given_a_gpu_after_the_wait_stops_the_change_there(
    gpu8: tuple[Simulator, RuntimeClients], host: Path, kubelet: Kubelet
) -> None:
    sim, clients = gpu8
    await bind_6_and_7(sim, host, kubelet)
    # free when the wait asks and when gpu-6 is about to change; gpu-7 taken by a VM after that
    kubelet.later, kubelet.after_calls = {"vm-b": ("gpu-7",)}, 3
    code, res = await run(sim, host, ALL_WHOLE_LAYOUT, kubelet.socket_path)
    assert (code, res["reason"]) == (result.EXIT_BUSY, "AllocationsLive"), res
    assert res["blocked_by"] == ["gpu-7 by vms/vm-b/compute (aliyun.com/gpu-vfio)"]
    assert "changed: gpu-6: vfio-pci → whole" in res["message"], res["message"]
    assert res["devices_changed"] == ["gpu-6"]
    assert await state(clients) == {**ALL_WHOLE, "gpu-7": "vfio"}
