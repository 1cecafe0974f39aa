"""pytest fixtures of the simulator part of the harness: runtime_sim, runtime_sim_factory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio

from lj_runtimekit_testkit.simulator.simulator import Simulator

SimulatorFactory = Callable[..., Awaitable[Simulator]]


def _short_dir() -> Path:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path is often longer.
    return Path(tempfile.mkdtemp(prefix="ljsim-"))


@pytest_asyncio.fixture
async def runtime_sim_factory() -> AsyncIterator[SimulatorFactory]:
    """``await runtime_sim_factory(inventory="mig-tdm", socket_dir=None, **kwargs)``: started."""
    started: list[Simulator] = []
    made: list[Path] = []

    async def make(
        inventory: str = "gpu-8x-nvlink", socket_dir: str | Path | None = None, **kwargs: Any
    ) -> Simulator:
        if socket_dir is None:
            socket_dir = _short_dir()
            made.append(socket_dir)
        sim = Simulator(socket_dir, inventory, **kwargs)
        started.append(sim)
        await sim.start()
        return sim

    try:
        yield make
    finally:
        for sim in started:
            await sim.stop()
        for directory in made:  # only the ones made here: a caller's directory is its own
            shutil.rmtree(directory, ignore_errors=True)


@pytest_asyncio.fixture
async def runtime_sim(runtime_sim_factory: SimulatorFactory) -> Simulator:
    """A running Simulator with inventory ``gpu-8x-nvlink`` in a fresh socket dir."""
    return await runtime_sim_factory()
