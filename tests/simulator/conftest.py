"""Real grpc.aio channels to a running simulator's sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from lj_runtimekit_testkit.simulator import Simulator
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients


@pytest_asyncio.fixture
async def clients(runtime_sim: Simulator) -> AsyncIterator[RuntimeClients]:
    async with runtime_clients(runtime_sim) as c:
        yield c
