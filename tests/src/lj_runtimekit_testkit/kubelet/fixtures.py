"""pytest fixtures of the kubelet part of the harness: ``kubelet_emulator`` (no cluster) and
``emulated_gpu_node`` (a KWOK node with a runtime simulator and a kubelet emulator for it)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio
from kubernetes import client

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.kubelet.emulator import KubeletEmulator
from lj_runtimekit_testkit.simulator.fixtures import SimulatorFactory
from lj_runtimekit_testkit.simulator.simulator import Simulator


@pytest_asyncio.fixture
async def kubelet_emulator() -> AsyncIterator[KubeletEmulator]:
    """A started emulator without a cluster, on a short temp plugin dir (unix path limits)."""
    plugin_dir = tempfile.mkdtemp(prefix="kubelet-")
    emulator = KubeletEmulator("emulated-node", plugin_dir)
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


@dataclass(frozen=True)
class EmulatedGpuNode:
    """A KWOK node whose device side is real: point a device plugin at ``plugin_dir`` and
    ``simulator.socket_dir``, and its resources show up on node ``name``."""

    name: str
    emulator: KubeletEmulator
    simulator: Simulator

    @property
    def plugin_dir(self) -> str:
        return self.emulator.plugin_dir


@pytest_asyncio.fixture
async def emulated_gpu_node(
    cluster: Cluster, runtime_sim_factory: SimulatorFactory
) -> AsyncIterator[EmulatedGpuNode]:
    """A fresh KWOK node (no GPU capacity until a plugin registers, ``lj_runtimekit_enable=true``),
    the runtime simulator with ``gpu-8x-nvlink``, and a kubelet emulator bound to the cluster."""
    name = cluster.create_gpu_nodes(1, prefix="emulated-gpu", gpus=0, enable=True)[0]
    simulator = await runtime_sim_factory()
    plugin_dir = tempfile.mkdtemp(prefix="kubelet-")
    emulator = KubeletEmulator(name, plugin_dir, cluster)
    await emulator.start()
    try:
        yield EmulatedGpuNode(name, emulator, simulator)
    finally:
        await emulator.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
        with cluster.api_client() as api:
            client.CoreV1Api(api).delete_node(name)
