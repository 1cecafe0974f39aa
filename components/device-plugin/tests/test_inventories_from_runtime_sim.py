"""MIG single/mixed, TDM and PPU advertised from the simulator's inventories."""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_device_plugin.resources import ResourceNames, advertise, capacity
from lj_runtimekit_device_plugin.runtime import RuntimeClient


async def _capacity(sim: Any, names: ResourceNames) -> dict[str, int]:
    client = RuntimeClient(str(sim.socket_dir))
    try:
        return capacity(advertise(await client.list_devices(), names))
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # gpu-0: 2 MIG, gpu-1: 7 MIG, gpu-2: 3 TDM slices, gpu-3: whole and shareable
        ("single", {"aliyun.com/gpu": 2 + 7 + 3 + 1}),
        (
            "mixed",
            {"aliyun.com/gpu-mig-3g.40gb": 2, "aliyun.com/gpu-mig-1g.10gb": 7, "aliyun.com/gpu": 4},
        ),
    ],
    ids=["single", "mixed"],
)
async def test_mig_and_tdm_advertised_as_configured(
    runtime_sim_factory: Any, strategy: str, expected: dict[str, int]
) -> None:
    sim = await runtime_sim_factory(inventory="mig-tdm")
    caps = await _capacity(sim, ResourceNames(mig_strategy=strategy))
    assert {k: v for k, v in caps.items() if "core" not in k and "memory" not in k} == expected
    assert caps["aliyun.com/gpu-core"] == 100
    assert caps["aliyun.com/gpu-memory"] == 80


async def test_ppu_node_advertises_ppus(runtime_sim_factory: Any) -> None:
    sim = await runtime_sim_factory(inventory="ppu-8x")
    assert await _capacity(sim, ResourceNames()) == {"alibabacloud.com/ppu": 8}
