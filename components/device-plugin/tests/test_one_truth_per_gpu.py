"""One truth per GPU: what a shared container is told (its environment) is what the Runtime
holds for it, whatever the assignment lists — checked against the runtime simulator's ledger."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.deviceplugin.assignment import (
    ASSIGNMENT,
    BadAssignment,
    Share,
    one_per_device,
    parse,
)
from lj_runtimekit_device_plugin.deviceplugin.handshake import SharedHandshake
from lj_runtimekit_device_plugin.errors import PermanentError
from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.podview import PodView
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient, release

NAMES = ResourceNames()
NODE = "n1"
GIB = 1 << 30


def _doc(devices: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "version": "v1",
            "node": NODE,
            "assumedAt": "t",
            "containers": [{"name": "c", "devices": devices}],
        }
    )


def test_a_gpu_listed_twice_is_one_share_of_the_sum() -> None:
    a = parse(_doc([{"id": "gpu-0", "core": 30}, {"id": "gpu-0", "core": 30, "memoryGiB": 2}]))
    assert a.containers["c"] == (Share("gpu-0", 60, 2),)


@pytest.mark.parametrize(
    "devices",
    [
        [{"id": "gpu-0", "core": 30}, {"id": "gpu-1", "core": 30}],
        [{"id": "gpu-0", "whole": True}, {"id": "gpu-0", "core": 30}],
    ],
    ids=["shares-of-two-gpus", "whole-and-shared"],
)
def test_an_assignment_that_cannot_be_one_truth_per_gpu_is_refused(
    devices: list[dict[str, Any]],
) -> None:
    with pytest.raises(BadAssignment, match="container c"):
        parse(_doc(devices))


def test_whole_devices_listed_twice_are_one_device() -> None:
    shares = one_per_device("c", [Share("gpu-0", whole=True), Share("gpu-0", whole=True)])
    assert shares == (Share("gpu-0", whole=True),)


device = st.fixed_dictionaries(
    {"id": st.sampled_from(["gpu-0", "gpu-1"])},
    optional={"core": st.integers(0, 60), "memoryGiB": st.integers(0, 12)},
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(devices=st.lists(device, min_size=1, max_size=4), both=st.booleans())
async def test_the_environment_a_shared_container_gets_is_what_the_runtime_holds(
    runtime_sim: Any, devices: list[dict[str, Any]], both: bool
) -> None:
    core = sum(d.get("core", 0) for d in devices)
    memory = sum(d.get("memoryGiB", 0) for d in devices)
    requests = {NAMES.gpu_core: core, NAMES.gpu_memory: memory} if both else {}
    if not both:
        requests = {NAMES.gpu_core: core} if core else {NAMES.gpu_memory: memory}
    requests = {r: n for r, n in requests.items() if n}
    if not requests:
        return
    pod = PodView("ns", "p", "uid-p", "1", {ASSIGNMENT: _doc(devices)}, {"c": requests})

    async def pods() -> list[PodView]:
        return [pod]

    async def mark(p: PodView, update: Any) -> None:
        return None

    client = RuntimeClient(str(runtime_sim.socket_dir), 2.0)
    shake = SharedHandshake(
        client, NAMES, NODE, pods, mark, devices=lambda: _inventory(runtime_sim)
    )
    try:
        for resource, units in requests.items():
            try:
                injection = await shake.allocate(resource, [f"u{i}" for i in range(units)])
            except PermanentError:
                assert runtime_sim.allocations() == [], "a refusal leaves nothing held"
                continue
            held = [a for a in runtime_sim.allocations() if a.pod.uid == "uid-p"]
            envs = dict(injection.envs)
            assert envs["LJ_GPU_CORE_PERCENT"] == str(sum(a.core_percent for a in held))
            assert envs["LJ_GPU_MEMORY_LIMIT_BYTES"] == str(sum(a.memory_bytes for a in held))
            on = sorted({d for a in held for d in a.device_ids})
            assert sorted(envs["LJ_VISIBLE_DEVICES"].split(",")) == on
            assert (core, memory * GIB) == (
                sum(a.core_percent for a in held),
                sum(a.memory_bytes for a in held),
            ), "the Runtime holds what the pod asked, no more"
    finally:
        for a in runtime_sim.allocations():
            await release(client, a.id)
        await client.close()


def _inventory(sim: Any) -> list[Device]:
    """The simulator's devices as the plugin's model (the handshake checks room against it)."""
    return [Device(id=d.id, memory_bytes=d.memory_bytes) for d in sim.devices()]
