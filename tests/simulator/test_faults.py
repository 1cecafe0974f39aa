"""Fault switches: injected failures and delays, an older Runtime, one socket restarted."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import config_pb2 as cpb
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_interface.runtime.v1 import monitor_pb2 as mpb
from lj_runtimekit_testkit.simulator import Simulator
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.fixtures import SimulatorFactory


async def test_failed_method_answers_the_injected_code_until_cleared(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    runtime_sim.fail("ListDevices", grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.device.ListDevices(pb.ListDevicesRequest())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "injected" in (err.value.details() or "")
    await clients.device.GetVersion(pb.GetVersionRequest())  # other methods unaffected
    runtime_sim.fail("DeviceService.ListDevices", None)
    assert (await clients.device.ListDevices(pb.ListDevicesRequest())).devices
    assert runtime_sim.calls("ListDevices") == 2


async def test_delayed_method_is_slow_but_answers(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    runtime_sim.fail("GetDeviceMetrics", None, delay_s=0.3)
    t0 = time.monotonic()
    await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest())
    assert time.monotonic() - t0 >= 0.3
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest(), timeout=0.1)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_unknown_method_is_refused_by_name(runtime_sim: Simulator) -> None:
    with pytest.raises(ValueError, match="unknown Runtime method 'Allocat'"):
        runtime_sim.fail("Allocat", grpc.StatusCode.INTERNAL)


async def test_older_runtime_answers_unimplemented_for_what_it_lacks(
    runtime_sim_factory: SimulatorFactory,
) -> None:
    old = ["DeviceService.GetVersion", "DeviceService.ListDevices", "DeviceService.Allocate"]
    sim = await runtime_sim_factory(capabilities=old)
    async with runtime_clients(sim) as c:
        version = await c.device.GetVersion(pb.GetVersionRequest())
        assert list(version.capabilities) == old
        assert (await c.device.ListDevices(pb.ListDevicesRequest())).devices
        for call in (
            c.device.WatchDevices(pb.WatchDevicesRequest()).read(),
            c.monitor.GetAllocationUsage(mpb.GetAllocationUsageRequest()),
            c.config.GetFeatureState(cpb.GetFeatureStateRequest()),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_one_socket_restarts_while_the_others_serve(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    await runtime_sim.stop(["MonitorService"])
    assert not runtime_sim.socket_path("MonitorService").exists()
    assert runtime_sim.socket_path("DeviceService").exists()
    await clients.device.GetVersion(pb.GetVersionRequest())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.monitor.GetDeviceMetrics(mpb.GetDeviceMetricsRequest(), timeout=0.5)
    assert err.value.code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    await runtime_sim.start(["MonitorService"])
    out = await clients.monitor.GetDeviceMetrics(
        mpb.GetDeviceMetricsRequest(), wait_for_ready=True, timeout=5
    )
    assert len(out.devices) == 8


async def test_restart_keeps_the_watch_client_able_to_resubscribe(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    stream = clients.device.WatchDevices(pb.WatchDevicesRequest())
    await asyncio.wait_for(stream.read(), 1.0)
    await runtime_sim.restart()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(stream.read(), 2.0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    again = clients.device.WatchDevices(pb.WatchDevicesRequest(), wait_for_ready=True)
    first = await asyncio.wait_for(again.read(), 5.0)
    assert isinstance(first, pb.WatchDevicesResponse)
    assert first.type == pb.DEVICE_EVENT_TYPE_SNAPSHOT
    again.cancel()


async def test_too_long_socket_dir_is_refused_clearly() -> None:
    sim = Simulator("/tmp/" + "d" * 110, "gpu-1x")
    with pytest.raises(OSError, match="longer than 107 bytes"):
        await sim.start()
    await sim.stop()


async def test_repartitioning_is_streamed_as_partitions_changed(
    clients: RuntimeClients, runtime_sim: Simulator
) -> None:
    stream = clients.device.WatchDevices(pb.WatchDevicesRequest())
    await asyncio.wait_for(stream.read(), 1.0)
    await clients.config.SetPartitioning(
        cpb.SetPartitioningRequest(device_id="gpu-2", tdm=cpb.TdmSpec(slice_percents=[25, 75]))
    )
    event = await asyncio.wait_for(stream.read(), 1.0)
    assert isinstance(event, pb.WatchDevicesResponse)
    assert event.type == pb.DEVICE_EVENT_TYPE_PARTITIONS_CHANGED
    assert [p.id for p in event.devices[0].partitions] == ["gpu-2-tdm-0", "gpu-2-tdm-1"]
    stream.cancel()
