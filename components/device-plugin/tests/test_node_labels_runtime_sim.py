"""The driver facts the labels need, from the harness's runtime simulator over its unix socket:
a Runtime that reports them, and one that predates them."""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc

from lj_runtimekit_device_plugin.nodedevices import LABEL_PREFIX, labels
from lj_runtimekit_device_plugin.runtime import RuntimeClient, driver_facts
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory


async def _facts_and_labels(sim: Any) -> tuple[Any, dict[str, str]]:
    client = RuntimeClient(str(sim.socket_dir))
    try:
        facts = await driver_facts(client)
        got = labels(await client.list_devices(), await client.version(), facts)
    finally:
        await client.close()
    return facts, {k.removeprefix(LABEL_PREFIX): v for k, v in got.items()}


async def test_simulator_reports_the_driver_and_each_gpus_compute_capability(
    runtime_sim_factory: Any,
) -> None:
    sim = await runtime_sim_factory(inventory="mig-tdm")  # NVIDIA A100-SXM4-80GB, no driver key
    facts, got = await _facts_and_labels(sim)
    assert facts.driver_version == "550.54.15"  # the simulator's default
    assert set(facts.compute_capability.values()) == {"8.0"}
    assert facts.partition_modes  # the inventory's `supports`
    assert got["driver-version"] == "550.54.15"
    assert (got["compute.major"], got["compute.minor"]) == ("8", "0")
    assert got["mig-3g.40gb.count"] == "2"
    assert got["mig-1g.10gb.count"] == "7"
    assert got["mig.capable"] == "true"


async def test_inventory_sets_the_driver_version(runtime_sim_factory: Any) -> None:
    inv = dataclasses.replace(load_inventory("gpu-1x"), driver_version="535.161.08")
    facts, got = await _facts_and_labels(await runtime_sim_factory(inventory=inv))
    assert facts.driver_version == "535.161.08"
    assert got["driver-version.major"] == "535"


async def test_a_runtime_without_the_new_fields_gives_labels_without_them(
    runtime_sim_factory: Any,
) -> None:
    inv = load_inventory("gpu-8x-nvlink")
    old = dataclasses.replace(
        inv,
        driver_version="",
        devices=tuple(
            dataclasses.replace(d, compute_capability="", supports=frozenset()) for d in inv.devices
        ),
    )
    facts, got = await _facts_and_labels(await runtime_sim_factory(inventory=old))
    assert facts.driver_version == ""
    assert not facts.compute_capability
    assert not {"driver-version", "compute.major", "mig.capable"} & set(got)
    assert got["count"] == "8"


async def test_a_runtime_without_get_version_gives_no_driver_version(
    runtime_sim_factory: Any,
) -> None:
    sim = await runtime_sim_factory(inventory="gpu-1x")
    sim.fail("GetVersion", grpc.StatusCode.UNIMPLEMENTED)
    facts, got = await _facts_and_labels(sim)
    assert facts.driver_version == ""
    assert "driver-version" not in got
    assert (got["compute.major"], got["compute.minor"]) == ("8", "9")  # NVIDIA L4
