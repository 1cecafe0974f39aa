"""The misbehaving Runtime of the testkit does what it is told, on real sockets, so the tests
that use it against the daemons attack what they claim to."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.message import DecodeError, Message

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import (
    device_pb2,
    device_pb2_grpc,
    monitor_pb2,
    monitor_pb2_grpc,
)
from lj_runtimekit_testkit.hostile_runtime import (
    NOT_PROTOBUF,
    HostileRuntime,
    metrics_reply,
    non_utf8_string_field,
    socket_dir,
    version_reply,
)


@pytest.fixture
async def hostile() -> AsyncIterator[HostileRuntime]:
    with socket_dir() as d:
        h = HostileRuntime(d)
        await h.start()
        try:
            yield h
        finally:
            await h.stop()


def _channel(h: HostileRuntime, name: str = sockets.DEVICE_SOCKET) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(sockets.unix_target(str(h.socket_dir / name)))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (NOT_PROTOBUF, device_pb2.ListDevicesResponse),
        (non_utf8_string_field(1, 1), device_pb2.ListDevicesResponse),
        (non_utf8_string_field(1), device_pb2.GetVersionResponse),
        (non_utf8_string_field(2, 1), device_pb2.WatchDevicesResponse),
    ],
    ids=["not-protobuf", "devices-id", "version", "watch-devices-id"],
)
def test_the_garbage_helpers_do_not_parse(raw: bytes, message: type[Message]) -> None:
    with pytest.raises(DecodeError):
        message.FromString(raw)


async def test_answers_are_sent_as_given_and_counted(hostile: HostileRuntime) -> None:
    hostile.answer("GetVersion", version_reply("x"))
    hostile.answer("ListDevices", NOT_PROTOBUF)
    hostile.answer("GetDeviceMetrics", metrics_reply())
    async with _channel(hostile) as ch:
        stub = device_pb2_grpc.DeviceServiceStub(ch)
        v = await stub.GetVersion(device_pb2.GetVersionRequest(), timeout=5)
        assert list(v.capabilities) == ["x"]
        # grpc-aio's own answer for a reply that does not parse: None
        assert await stub.ListDevices(device_pb2.ListDevicesRequest(), timeout=5) is None
    async with _channel(hostile, sockets.MONITOR_SOCKET) as ch:
        m = monitor_pb2_grpc.MonitorServiceStub(ch)
        r = await m.GetDeviceMetrics(monitor_pb2.GetDeviceMetricsRequest(), timeout=5)
        assert list(r.devices) == []
    assert hostile.calls("GetVersion") == 1
    assert hostile.calls("ListDevices") == 1


async def _drain(call: object, into: list[int]) -> None:
    async for ev in call:  # type: ignore[attr-defined]
        into.append(ev.type)


async def test_hang_abort_and_a_stream_failing_midway(hostile: HostileRuntime) -> None:
    hostile.answer("ListDevices", hang=True)
    hostile.answer("Release", abort=grpc.StatusCode.INTERNAL)
    snap = device_pb2.WatchDevicesResponse(type=device_pb2.DEVICE_EVENT_TYPE_SNAPSHOT)
    hostile.answer("WatchDevices", snap, snap, abort=grpc.StatusCode.UNAVAILABLE)
    async with _channel(hostile) as ch:
        stub = device_pb2_grpc.DeviceServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as hung:
            await stub.ListDevices(device_pb2.ListDevicesRequest(), timeout=0.2)
        assert hung.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.aio.AioRpcError) as aborted:
            await stub.Release(device_pb2.ReleaseRequest(), timeout=5)
        assert aborted.value.code() == grpc.StatusCode.INTERNAL
        got: list[int] = []
        with pytest.raises(grpc.aio.AioRpcError) as broke:
            await _drain(stub.WatchDevices(device_pb2.WatchDevicesRequest(), timeout=5), got)
        assert broke.value.code() == grpc.StatusCode.UNAVAILABLE
        assert got == [device_pb2.DEVICE_EVENT_TYPE_SNAPSHOT] * 2


def test_an_unknown_method_is_refused_at_once() -> None:
    with socket_dir() as d, pytest.raises(KeyError, match="Knock"):
        HostileRuntime(d).answer("Knock")
