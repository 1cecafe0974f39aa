"""Real grpc.aio clients of a simulator's three sockets, for tests that talk to it as a peer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from lj_runtimekit_interface.runtime.v1 import config_pb2_grpc as cgrpc
from lj_runtimekit_interface.runtime.v1 import device_pb2_grpc as dgrpc
from lj_runtimekit_interface.runtime.v1 import monitor_pb2_grpc as mgrpc
from lj_runtimekit_testkit.simulator.simulator import Simulator


@dataclass(frozen=True)
class RuntimeClients:
    device: dgrpc.DeviceServiceAsyncStub
    monitor: mgrpc.MonitorServiceAsyncStub
    config: cgrpc.ConfigServiceAsyncStub


@contextlib.asynccontextmanager
async def runtime_clients(sim: Simulator) -> AsyncIterator[RuntimeClients]:
    """One channel per socket, closed on exit; channels reconnect by themselves after a restart."""
    async with (
        grpc.aio.insecure_channel(sim.target("DeviceService")) as d,
        grpc.aio.insecure_channel(sim.target("MonitorService")) as m,
        grpc.aio.insecure_channel(sim.target("ConfigService")) as c,
    ):
        yield RuntimeClients(
            dgrpc.DeviceServiceStub(d), mgrpc.MonitorServiceStub(m), cgrpc.ConfigServiceStub(c)
        )
