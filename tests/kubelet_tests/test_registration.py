"""The emulator's Registration and device plugin calls, without a cluster."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import aiohttp
import grpc
import pytest
from grpc import aio

from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.sockets import HEALTHY, unix_target
from lj_runtimekit_testkit.kubelet import KubeletEmulator
from lj_runtimekit_testkit.kubelet.allocation import choose, resource_name_error
from lj_runtimekit_testkit.kubelet.sample_plugin import SampleDevicePlugin


async def eventually(what: str, check: Callable[[], bool], deadline_s: float = 5.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s} s")
        await asyncio.sleep(0.02)


async def test_plugin_registers_and_its_devices_are_followed(
    kubelet_emulator: KubeletEmulator,
) -> None:
    plugin = SampleDevicePlugin(kubelet_emulator.plugin_dir, "example.com/dev", 3)
    await plugin.start()
    try:
        await eventually("3 devices", lambda: len(kubelet_emulator.devices("example.com/dev")) == 3)
        assert set(kubelet_emulator.devices("example.com/dev").values()) == {HEALTHY}
        plugin.set_health("dev-1", healthy=False)
        await eventually(
            "dev-1 unhealthy",
            lambda: kubelet_emulator.devices("example.com/dev").get("dev-1") == "Unhealthy",
        )
        assert kubelet_emulator.resources()["example.com/dev"] == (3, 2)
    finally:
        await plugin.stop()


@pytest.mark.parametrize(
    ("version", "resource", "endpoint"),
    [
        ("v1alpha", "example.com/dev", "a.sock"),
        ("v1beta1", "dev", "a.sock"),
        ("v1beta1", "kubernetes.io/dev", "a.sock"),
        ("v1beta1", "example.com/dev", "../a.sock"),
    ],
    ids=["old-version", "no-domain", "kubernetes-namespace", "endpoint-outside-dir"],
)
async def test_registration_is_refused_as_the_kubelet_refuses_it(
    kubelet_emulator: KubeletEmulator, version: str, resource: str, endpoint: str
) -> None:
    async with aio.insecure_channel(unix_target(kubelet_emulator.socket_path)) as channel:
        with pytest.raises(aio.AioRpcError) as refused:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource)
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert kubelet_emulator.endpoints == {}


async def test_allocate_uses_preference_and_pre_start(kubelet_emulator: KubeletEmulator) -> None:
    plugin = SampleDevicePlugin(
        kubelet_emulator.plugin_dir, "example.com/dev", 4, preferred=True, pre_start=True
    )
    await plugin.start()
    try:
        await eventually("4 devices", lambda: len(kubelet_emulator.devices("example.com/dev")) == 4)
        ids = await kubelet_emulator.choose_devices("example.com/dev", 2)
        assert ids == ["dev-3", "dev-2"]
        response = await kubelet_emulator.allocate("example.com/dev", ids)
        assert response.envs["SAMPLE_DEVICES"] == "dev-3,dev-2"
        assert plugin.allocate_calls == [ids]
        assert plugin.pre_start_calls == [ids]
        # Units on demand stay in use: the next choice comes from the rest.
        assert await kubelet_emulator.choose_devices("example.com/dev", 2) == ["dev-0", "dev-1"]
    finally:
        await plugin.stop()


async def test_kubelet_restart_removes_sockets_and_plugin_registers_again(
    kubelet_emulator: KubeletEmulator,
) -> None:
    plugin = SampleDevicePlugin(kubelet_emulator.plugin_dir, "example.com/dev", 2)
    await plugin.start()
    try:
        await eventually("registered", lambda: kubelet_emulator.registrations == 1)
        await kubelet_emulator.restart()
        assert await asyncio.to_thread(os.path.exists, kubelet_emulator.socket_path)
        await eventually("registered again", lambda: kubelet_emulator.registrations == 2)
        await eventually(
            "devices back", lambda: len(kubelet_emulator.devices("example.com/dev")) == 2
        )
        assert plugin.registrations == 2
    finally:
        await plugin.stop()


async def test_pods_endpoint_serves_a_pod_list(kubelet_emulator: KubeletEmulator) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {}, "status": {}}
    kubelet_emulator.set_pods([pod])
    async with aiohttp.ClientSession() as session, session.get(kubelet_emulator.pods_url) as resp:
        body = await resp.json()
    assert body["kind"] == "PodList"
    assert body["items"] == [pod]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("aliyun.com/gpu", True),
        ("alibabacloud.com/ppu", True),
        ("gpu", False),
        ("x.kubernetes.io/gpu", False),
        ("Example.com/gpu", False),
    ],
    ids=["gpu", "ppu", "bare", "k8s-namespace", "uppercase-domain"],
)
def test_resource_name_validation(name: str, ok: bool) -> None:
    assert (resource_name_error(name) is None) is ok


def test_choice_takes_all_when_exact_and_fills_a_short_preference() -> None:
    assert choose(["a", "b"], 2, ["b"]) == ["a", "b"]
    assert choose(["a", "b", "c"], 2, ["c", "zz"]) == ["c", "a"]
    with pytest.raises(ValueError, match="only 1"):
        choose(["a"], 2)
