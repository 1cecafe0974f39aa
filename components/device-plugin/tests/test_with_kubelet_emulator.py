"""The whole daemon with the harness's kubelet emulator and runtime simulator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.settings import load


async def _until(cond: Any, within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def plugin(kubelet_emulator: Any, runtime_sim: Any) -> AsyncIterator[None]:
    s = load(
        [
            "--socket-dir",
            str(runtime_sim.socket_dir),
            "--plugin-dir",
            kubelet_emulator.plugin_dir,
            "--port",
            "0",
            "--node-name",
            "emulated-node",
        ],
        {},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(s, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_emulated_kubelet_sees_8_800_and_memory_then_health_and_restart(
    plugin: None, kubelet_emulator: Any, runtime_sim: Any
) -> None:
    k = kubelet_emulator
    await _until(lambda: k.resources().get("aliyun.com/gpu", (0, 0))[1] == 8)
    await _until(lambda: k.resources().get("aliyun.com/gpu-core", (0, 0))[1] == 800)
    await _until(lambda: k.resources().get("aliyun.com/gpu-memory", (0, 0))[1] == 8 * 80)
    loop = asyncio.get_running_loop()
    start = loop.time()
    runtime_sim.set_health("gpu-2", False, "XID 79")
    await _until(lambda: k.devices("aliyun.com/gpu").get("gpu-2") == "Unhealthy", 1.0)
    assert loop.time() - start < 1.0
    assert k.resources()["aliyun.com/gpu"][1] == 7
    runtime_sim.set_health("gpu-2", True)
    await _until(lambda: k.devices("aliyun.com/gpu").get("gpu-2") == "Healthy", 1.0)
    await k.restart()
    await _until(lambda: k.resources().get("aliyun.com/gpu", (0, 0))[1] == 8, 10.0)
