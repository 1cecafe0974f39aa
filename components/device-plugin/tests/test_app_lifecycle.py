"""The whole daemon: registers after serving, re-registers after a kubelet restart, cleans up.

The harness's kubelet emulator has not landed yet; until it does, a minimal Registration
server stands in at this boundary (it only records what the plugin sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from lj_runtimekit_device_plugin.app import serve
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc


class Registrar(api_pb2_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        self.seen.append(request.resource_name)
        return api_pb2.Empty()


async def _kubelet(plugin_dir: Path, reg: Registrar) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(reg, server)
    server.add_insecure_port(sockets.unix_target(str(plugin_dir / sockets.KUBELET_SOCKET)))
    await server.start()
    return server


async def _until(cond: Any, within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_registers_reregisters_after_kubelet_restart_and_removes_sockets(
    runtime_sim: Any, kubelet_dir: Path
) -> None:
    plugin_dir = kubelet_dir
    reg = Registrar()
    kubelet = await _kubelet(plugin_dir, reg)
    s = load(
        [
            "--socket-dir",
            str(runtime_sim.socket_dir),
            "--plugin-dir",
            str(plugin_dir),
            "--port",
            "0",
            "--node-name",
            "n1",
            "--log-format",
            "console",
        ],
        {},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(s, stop))
    want = {"aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory"}
    try:
        await _until(lambda: set(reg.seen) == want)
        ours = sorted(p for p in os.listdir(plugin_dir) if p.startswith("lj-"))
        assert len(ours) == 3
        # a kubelet restart: it removes every socket and recreates kubelet.sock
        await kubelet.stop(None)
        for p in os.listdir(plugin_dir):
            os.unlink(plugin_dir / p)
        reg.seen.clear()
        kubelet = await _kubelet(plugin_dir, reg)
        await _until(lambda: set(reg.seen) == want)
        assert len([p for p in os.listdir(plugin_dir) if p.startswith("lj-")]) == 3
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop(None)
    assert [p for p in os.listdir(plugin_dir) if p.startswith("lj-")] == []


async def test_healthz_and_metrics_answer(runtime_sim: Any, kubelet_dir: Path) -> None:
    plugin_dir = kubelet_dir
    reg = Registrar()
    kubelet = await _kubelet(plugin_dir, reg)
    port = 19502
    s = load(
        [
            "--socket-dir",
            str(runtime_sim.socket_dir),
            "--plugin-dir",
            str(plugin_dir),
            "--port",
            str(port),
            "--listen-address",
            "127.0.0.1",
            "--node-name",
            "n1",
        ],
        {},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(s, stop))
    try:
        await _until(lambda: len(reg.seen) == 3)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
        assert 'lj_device_plugin_registrations_total{resource="aliyun.com/gpu"} 1.0' in text
        assert 'lj_device_plugin_devices{healthy="true"} 8.0' in text
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await kubelet.stop(None)
