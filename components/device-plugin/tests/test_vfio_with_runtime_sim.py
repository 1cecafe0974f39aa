"""GPUs bound to vfio-pci while the whole daemon runs, with the harness's runtime simulator and
kubelet emulator: the bound GPUs move from aliyun.com/gpu to aliyun.com/gpu-vfio and back, their
Allocate never reaches the Runtime, and an older Runtime gives no vfio resource and no error."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.deviceplugin.plugins import PluginHost
from lj_runtimekit_device_plugin.deviceplugin.server import socket_name
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.model import GIB, Device, Injection
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator.clients import runtime_clients
from lj_runtimekit_testkit.simulator.services import ALL_METHODS, SET_DEVICE_BINDING

GPU, CORE, MEM, VFIO = (
    "aliyun.com/gpu",
    "aliyun.com/gpu-core",
    "aliyun.com/gpu-memory",
    "aliyun.com/gpu-vfio",
)
Start = Callable[[Any], Awaitable[None]]


async def _until(cond: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def start_plugin(kubelet_emulator: Any) -> AsyncIterator[Start]:
    """``await start_plugin(sim)``: the daemon on the emulator's plugin dir and ``sim``. Ask for
    it after the simulator's fixture, so that the plugin stops before the Runtime does."""
    tasks: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    k = kubelet_emulator

    async def start(sim: Any) -> None:
        s = load(
            [
                "--socket-dir",
                str(sim.socket_dir),
                "--plugin-dir",
                k.plugin_dir,
                "--metrics-bind-address",
                "127.0.0.1:0",
                "--node-name",
                "emulated-node",
                "--kubelet-pods-url",
                k.pods_url,
                "--pod-resources-socket",
                k.pod_resources_socket,
            ],
            {},
        )
        stop = asyncio.Event()
        tasks.append((stop, asyncio.create_task(serve(s, stop))))

    try:
        yield start
    finally:
        for stop, task in tasks:
            stop.set()
            await asyncio.wait_for(task, 10)


def _serves(k: Any, resource: str) -> bool:
    """Whether the plugin's socket for ``resource`` is in the kubelet's directory."""
    return os.path.exists(os.path.join(k.plugin_dir, socket_name(resource)))


def _allocatable(k: Any) -> dict[str, int]:
    return {r: a for r, (_, a) in k.resources().items()}


async def test_binding_two_of_eight_gpus_moves_them_to_the_vfio_resource_and_back(
    runtime_sim: Any, kubelet_emulator: Any, start_plugin: Start
) -> None:
    k = kubelet_emulator
    await start_plugin(runtime_sim)
    await _until(lambda: _allocatable(k) == {GPU: 8, CORE: 800, MEM: 8 * 80})
    registrations = k.registrations

    async with runtime_clients(runtime_sim) as c:
        for gpu in ("gpu-6", "gpu-7"):
            await c.config.SetDeviceBinding(
                cpb.SetDeviceBindingRequest(device_id=gpu, binding=pb.DEVICE_BINDING_VFIO)
            )
        expected = {GPU: 6, CORE: 600, MEM: 6 * 80, VFIO: 2}
        await _until(lambda: _allocatable(k) == expected)
        assert sorted(k.devices(VFIO)) == ["gpu-6", "gpu-7"]
        assert not {"gpu-6", "gpu-7"} & set(k.devices(GPU))
        # only the new resource registered: the others kept their streams
        assert k.registrations == registrations + 1

        chosen = await k.choose_devices(VFIO, 2)
        response = await k.allocate(VFIO, chosen)
        assert [d.host_path for d in response.devices] == [
            "/dev/vfio/vfio",
            "/dev/vfio/22",
            "/dev/vfio/23",
        ]
        assert response.envs["PCI_RESOURCE_ALIYUN_COM_GPU-VFIO"] == "0000:ba:00.0,0000:db:00.0"
        assert response.envs["PCI_RESOURCE_ALIYUN_COM_GPU_VFIO"] == "0000:ba:00.0,0000:db:00.0"
        assert runtime_sim.calls("Allocate") == 0
        assert not runtime_sim.allocations()

        # the whole-GPU resource still allocates through the Runtime, never a vfio GPU
        whole = await k.choose_devices(GPU, 6)
        await k.allocate(GPU, whole)
        (held,) = runtime_sim.allocations()
        assert sorted(held.device_ids) == [f"gpu-{i}" for i in range(6)]

        for gpu in ("gpu-6", "gpu-7"):
            await c.config.SetDeviceBinding(
                cpb.SetDeviceBindingRequest(device_id=gpu, binding=pb.DEVICE_BINDING_DRIVER)
            )
    await _until(lambda: _allocatable(k) == {GPU: 8, CORE: 800, MEM: 8 * 80, VFIO: 0})
    await _until(lambda: not _serves(k, VFIO))
    assert set(k.devices(GPU)) == {f"gpu-{i}" for i in range(8)}


async def test_an_older_runtime_gives_no_vfio_resource_and_no_error(
    runtime_sim_factory: Any, kubelet_emulator: Any, start_plugin: Start
) -> None:
    k = kubelet_emulator
    sim = await runtime_sim_factory(
        capabilities=[m for m in ALL_METHODS if m != SET_DEVICE_BINDING]
    )
    await start_plugin(sim)
    await _until(lambda: _allocatable(k) == {GPU: 8, CORE: 800, MEM: 8 * 80})
    whole = await k.choose_devices(GPU, 1)
    await k.allocate(GPU, whole)
    assert len(sim.allocations()) == 1
    assert VFIO not in k.resources()
    assert not _serves(k, VFIO)


async def test_a_gpu_bound_while_the_plugins_register_is_advertised_at_the_next_poll(
    kubelet_emulator: Any,
) -> None:
    """start() registers one plugin after another; a binding that lands in between is a change
    of resources the host must still act on (it once took the post-start look as served)."""
    k = kubelet_emulator
    inventory = Inventory()
    gpus = [Device(id=f"gpu-{i}", index=i, memory_bytes=80 * GIB) for i in range(8)]
    await inventory.replace(gpus)

    async def allocate(resource: str, ids: Any) -> list[Injection]:
        return [Injection() for _ in ids]

    class BoundMidway(PluginHost):
        async def _register(self, resource: str) -> bool:
            if resource == GPU:  # the first one: bind gpu-7 before the others register
                bound = Device(
                    id="gpu-7",
                    index=7,
                    memory_bytes=80 * GIB,
                    binding="vfio",
                    device_nodes=("/dev/vfio/23",),
                    pci_bus_id="0000:db:00.0",
                )
                await inventory.update([bound])
            return await super()._register(resource)

    host = BoundMidway(k.plugin_dir, inventory, ResourceNames(), allocate)
    task = asyncio.create_task(host.run(poll_s=0.05))
    try:
        await _until(lambda: _allocatable(k) == {GPU: 7, CORE: 700, MEM: 7 * 80, VFIO: 1})
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert not _serves(k, GPU)  # run() removes its sockets on exit
