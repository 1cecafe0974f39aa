"""Every refusal at Allocate shows on the pod (a Warning Event with the reason), and a retry
storm does not flood the apiserver: one Event per pod and reason per window, a bucket overall.
Against the runtime simulator (the real peer) through real sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_device_plugin.deviceplugin.allocate import Allocator
from lj_runtimekit_device_plugin.deviceplugin.assignment import ASSIGNMENT
from lj_runtimekit_device_plugin.deviceplugin.handshake import SharedHandshake
from lj_runtimekit_device_plugin.errors import DevicePluginError
from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.pod_events import PodEvents
from lj_runtimekit_device_plugin.podview import PodView
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient

NAMES = ResourceNames()
NODE = "n1"
CORE_UNITS = [f"gpu-0::core-{i}" for i in range(30)]


def _assignment(device: str = "gpu-0", core: int = 30, node: str = NODE) -> str:
    return json.dumps(
        {
            "version": "v1",
            "node": node,
            "assumedAt": "t",
            "containers": [{"name": "c", "devices": [{"id": device, "core": core}]}],
        }
    )


def _pod(annotations: dict[str, str], name: str = "p", core: int = 30) -> PodView:
    return PodView("ns", name, f"uid-{name}", "1", annotations, {"c": {NAMES.gpu_core: core}})


REFUSED = {
    "not-json": {ASSIGNMENT: "{not json"},
    "another-node": {ASSIGNMENT: _assignment(node="n2")},
    "path-like-device-id": {ASSIGNMENT: _assignment(device="../../dev/gpu-0")},
    "unknown-device": {ASSIGNMENT: _assignment(device="gpu-99")},
    "wrong-units": {ASSIGNMENT: _assignment(core=80)},
    "missing": {},
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _handshake(
    sim: Any,
    pods: list[PodView],
    events: PodEvents,
    socket_dir: str | None = None,
) -> tuple[RuntimeClient, SharedHandshake]:
    async def listed() -> list[PodView]:
        return pods

    async def mark(p: PodView, update: Any) -> None:
        raise AssertionError("a refused pod is not marked")

    client = RuntimeClient(socket_dir or str(sim.socket_dir), 2.0)
    inventory = [Device(id=d.id, memory_bytes=d.memory_bytes) for d in sim.devices()]
    shake = SharedHandshake(
        client, NAMES, NODE, listed, mark, events=events, devices=lambda: inventory
    )
    return client, shake


def _recorder(clock: Clock, **kwargs: Any) -> tuple[PodEvents, list[tuple[str, str, str]]]:
    posted: list[tuple[str, str, str]] = []

    async def post(p: PodView, reason: str, message: str) -> None:
        posted.append((p.name, reason, message))

    return PodEvents(post, clock=clock, **kwargs), posted


@pytest.mark.parametrize("annotations", list(REFUSED.values()), ids=list(REFUSED))
async def test_a_refused_assignment_records_a_warning_event_on_the_pod_with_the_reason(
    runtime_sim: Any, annotations: dict[str, str]
) -> None:
    events, posted = _recorder(Clock())
    client, shake = _handshake(runtime_sim, [_pod(annotations)], events)
    try:
        with pytest.raises(DevicePluginError) as err:
            await shake.allocate(NAMES.gpu_core, CORE_UNITS)
    finally:
        await client.close()
    assert [(name, reason) for name, reason, _ in posted] == [("p", "GpuAssignmentRefused")]
    message = posted[0][2]
    assert NAMES.gpu_core in message
    assert runtime_sim.allocations() == []
    assert str(err.value), "the kubelet gets the error too"


async def test_a_retry_storm_posts_one_event_per_pod_and_reason_per_window(
    runtime_sim: Any,
) -> None:
    clock = Clock()
    events, posted = _recorder(clock)
    client, shake = _handshake(runtime_sim, [_pod(REFUSED["another-node"])], events)
    try:
        for _ in range(50):  # the kubelet retrying
            with pytest.raises(DevicePluginError):
                await shake.allocate(NAMES.gpu_core, CORE_UNITS)
        assert len(posted) == 1
        clock.now += 61  # the window has passed: the pod shows the refusal still holds
        with pytest.raises(DevicePluginError):
            await shake.allocate(NAMES.gpu_core, CORE_UNITS)
    finally:
        await client.close()
    assert [reason for _, reason, _ in posted] == ["GpuAssignmentRefused"] * 2


async def test_many_refused_pods_at_once_are_bounded_by_the_overall_bucket() -> None:
    clock = Clock()
    dropped: list[str] = []
    events, posted = _recorder(clock, burst=5, qps=1.0, dropped=dropped.append)
    pods = [_pod({}, name=f"p{i}") for i in range(20)]
    await events.warn(pods, "GpuAssignmentRefused", "refused")
    assert len(posted) == 5
    assert dropped == ["GpuAssignmentRefused"] * 15
    clock.now += 2  # two tokens back
    await events.warn([_pod({}, name="late-0"), _pod({}, name="late-1")], "X", "m")
    assert len(posted) == 7


async def test_a_runtime_failure_at_a_shared_allocate_shows_on_the_pod(
    runtime_sim: Any, kubelet_dir: Path
) -> None:
    events, posted = _recorder(Clock())
    pod = _pod({ASSIGNMENT: _assignment()})
    client, shake = _handshake(runtime_sim, [pod], events, socket_dir=str(kubelet_dir))
    try:
        with pytest.raises(DevicePluginError, match=r"device-daemon\.sock"):
            await shake.allocate(NAMES.gpu_core, CORE_UNITS)
    finally:
        await client.close()
    assert [(n, r) for n, r, _ in posted] == [("p", "GpuAllocationFailed")]
    assert "device-daemon.sock" in posted[0][2]


async def test_a_runtime_refusal_of_a_whole_gpu_shows_on_the_owning_pod(runtime_sim: Any) -> None:
    events, posted = _recorder(Clock())
    pod = PodView("ns", "whole", "uid-w", "1", {}, {"c": {NAMES.gpu: 1}})

    async def listed() -> list[PodView]:
        return [pod]

    client = RuntimeClient(str(runtime_sim.socket_dir), 2.0)
    shake = _handshake(runtime_sim, [pod], events)[1]
    allocate = Allocator(client, NAMES, 2.0, shake, pods=listed, node=NODE)
    try:
        with pytest.raises(DevicePluginError):
            await allocate(NAMES.gpu, [["gpu-99"]])  # not a device of this node
    finally:
        await client.close()
        await shake.client.close()
    assert [(n, r) for n, r, _ in posted] == [("whole", "GpuAllocationFailed")]
    assert "gpu-99" in posted[0][2]
