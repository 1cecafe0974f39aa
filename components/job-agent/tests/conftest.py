"""Fixtures of the job agent's tests: a host root in a temp dir and a small config daemon.

The config daemon here is a boundary fake (the harness simulator replaces it when it lands): it
keeps one enabled flag and answers GetFeatureState/SetFeatures as the interface documents.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import config_pb2, config_pb2_grpc


@dataclass
class FakeConfigDaemon(config_pb2_grpc.ConfigServiceServicer):
    enabled: bool = False
    calls: list[str] = field(default_factory=list)
    refuse: grpc.StatusCode | None = None

    def _state(self) -> config_pb2.GetFeatureStateResponse:
        names = ("device-injection", "sharing", "monitoring")
        return config_pb2.GetFeatureStateResponse(
            enabled=self.enabled,
            features=[config_pb2.Feature(name=n, enabled=self.enabled) for n in names],
            runtime_version="v1.13.0-fake",
        )

    async def GetFeatureState(
        self, request: config_pb2.GetFeatureStateRequest, context: aio.ServicerContext[Any, Any]
    ) -> config_pb2.GetFeatureStateResponse:
        self.calls.append("GetFeatureState")
        return self._state()

    async def SetFeatures(
        self, request: config_pb2.SetFeaturesRequest, context: aio.ServicerContext[Any, Any]
    ) -> config_pb2.SetFeaturesResponse:
        self.calls.append("SetFeatures")
        if self.refuse is not None:
            await context.abort(self.refuse, "refused by the test")
        changed = self.enabled != request.enabled
        self.enabled = request.enabled
        return config_pb2.SetFeaturesResponse(changed=changed, state=self._state())

    async def SetPartitioning(
        self, request: config_pb2.SetPartitioningRequest, context: aio.ServicerContext[Any, Any]
    ) -> config_pb2.SetPartitioningResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by the agent")

    async def SetDeviceBinding(
        self, request: config_pb2.SetDeviceBindingRequest, context: aio.ServicerContext[Any, Any]
    ) -> config_pb2.SetDeviceBindingResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by enable and disable")

    async def CreatePartition(
        self, request: config_pb2.CreatePartitionRequest, context: aio.ServicerContext[Any, Any]
    ) -> config_pb2.CreatePartitionResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "used by the DRA driver only")

    async def DeletePartition(
        self, request: config_pb2.DeletePartitionRequest, context: aio.ServicerContext[Any, Any]
    ) -> config_pb2.DeletePartitionResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "used by the DRA driver only")


@dataclass
class Node:
    root: Path
    socket_dir: Path
    daemon: FakeConfigDaemon
    restarts: Path

    @property
    def config(self) -> Path:
        return self.root / "etc/containerd/config.toml"

    def argv(self, action: str, *extra: str) -> list[str]:
        return [
            action,
            "--node-name=node-a",
            f"--host-root={self.root}",
            f"--socket-dir={self.socket_dir}",
            f"--restart-command={self.root / 'restart.sh'}",
            "--confirm-command=true",
            f"--termination-log={self.root / 'termination-log'}",
            "--restart-timeout=5",
            "--rpc-timeout=2",
            "--containerd-socket=",  # no containerd here: the file and marker decide
            *extra,
        ]

    def restart_count(self) -> int:
        return len(self.restarts.read_text().splitlines()) if self.restarts.exists() else 0


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    root = tmp_path / "host"
    (root / "etc/containerd").mkdir(parents=True)
    socket_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"lj-ja-{os.getpid()}-{id(tmp_path)}"
    socket_dir.mkdir()
    restarts = root / "restarts"
    script = root / "restart.sh"
    script.write_text(f"#!/bin/sh\necho restarted >> {restarts}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    daemon = FakeConfigDaemon()
    server = aio.server()
    config_pb2_grpc.add_ConfigServiceServicer_to_server(daemon, server)
    server.add_insecure_port(sockets.unix_target(str(socket_dir / sockets.CONFIG_SOCKET)))
    await server.start()
    try:
        yield Node(root, socket_dir, daemon, restarts)
    finally:
        await server.stop(None)
        for p in socket_dir.iterdir():
            p.unlink()
        socket_dir.rmdir()
