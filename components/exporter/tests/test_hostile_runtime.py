"""A Runtime (and a kubelet) answering garbage, hanging, or at the extremes: the exporter keeps
polling, serves what it can, says so in /healthz, and its exposition stays valid.

The misbehaving Runtime is the testkit's :mod:`hostile_runtime` on real unix sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit_exporter.app import Exporter
from lj_runtimekit_exporter.collector import Exposition, State
from lj_runtimekit_exporter.kubelet import (
    KubeletPods,
    PodResources,
    PodResourcesUnavailable,
    PodsUnavailable,
)
from lj_runtimekit_exporter.runtime import RuntimeClient, RuntimeGarbage, RuntimeUnavailable
from lj_runtimekit_exporter.settings import Settings
from lj_runtimekit_exporter.snapshot import Snapshot
from lj_runtimekit_interface.runtime.v1 import device_pb2, monitor_pb2
from lj_runtimekit_testkit.hostile_runtime import (
    NOT_PROTOBUF,
    HostileRuntime,
    metrics_reply,
    non_utf8_string_field,
    serve_bytes,
    socket_dir,
    version_reply,
)

GIB = 1 << 30
U64 = (1 << 64) - 1
ALL = (
    "DeviceService.ListDevices",
    "MonitorService.GetDeviceMetrics",
    "DeviceService.ListAllocations",
    "MonitorService.GetAllocationUsage",
)


def gpus(n: int = 2) -> device_pb2.ListDevicesResponse:
    return device_pb2.ListDevicesResponse(
        devices=[device_pb2.Device(id=f"gpu-{i}", index=i, memory_bytes=16 * GIB) for i in range(n)]
    )


@pytest.fixture
async def hostile() -> AsyncIterator[HostileRuntime]:
    with socket_dir() as d:
        h = HostileRuntime(d)
        h.answer("GetVersion", version_reply(*ALL))
        h.answer("ListDevices", gpus())
        await h.start()
        try:
            yield h
        finally:
            await h.stop()


@pytest.mark.parametrize(
    ("method", "bad"),
    [
        ("GetVersion", NOT_PROTOBUF),
        ("GetVersion", non_utf8_string_field(1)),
        ("ListDevices", NOT_PROTOBUF),
        ("ListDevices", non_utf8_string_field(1, 1)),
    ],
    ids=["version-bytes", "version-utf8", "devices-bytes", "devices-utf8"],
)
async def test_a_required_reply_that_does_not_parse_is_a_clear_error(
    hostile: HostileRuntime, method: str, bad: bytes
) -> None:
    hostile.answer(method, bad)
    async with RuntimeClient(str(hostile.socket_dir), 2.0) as client:
        with pytest.raises(RuntimeGarbage, match=f"{method} on .* not a valid reply"):
            await client.read(await client.version())


@pytest.mark.parametrize(
    ("method", "name"),
    [
        ("GetDeviceMetrics", "MonitorService.GetDeviceMetrics"),
        ("ListAllocations", "DeviceService.ListAllocations"),
        ("GetAllocationUsage", "MonitorService.GetAllocationUsage"),
    ],
)
async def test_an_optional_reply_that_does_not_parse_leaves_only_its_part_out(
    hostile: HostileRuntime, method: str, name: str
) -> None:
    hostile.answer(method, NOT_PROTOBUF)
    async with RuntimeClient(str(hostile.socket_dir), 2.0) as client:
        state = await client.read(await client.version())
        assert client.invalid == {name}
    assert [d.id for d in state.devices] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize("method", ["GetVersion", "ListDevices", "GetDeviceMetrics"])
async def test_a_hanging_runtime_call_is_bounded(hostile: HostileRuntime, method: str) -> None:
    hostile.answer(method, hang=True)
    async with RuntimeClient(str(hostile.socket_dir), 0.3) as client:
        with pytest.raises(RuntimeUnavailable, match="DEADLINE_EXCEEDED"):
            await client.read(await client.version())


@contextlib.asynccontextmanager
async def exporter(hostile: HostileRuntime, **kw: Any) -> AsyncIterator[tuple[Exporter, str]]:
    s = Settings(
        node_name="n1",
        socket_dir=str(hostile.socket_dir),
        metrics_bind_address="127.0.0.1:0",
        pods_source="none",
        poll_interval=0.1,
        rpc_timeout=0.5,
        log_format="text",
        **{"pod_resources_socket": "", **kw},
    )
    e = Exporter(s)
    await e.start()
    try:
        yield e, f"http://127.0.0.1:{e.port}"
    finally:
        await e.stop()


async def _until(cond: Any, within_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.text()


async def test_the_poll_loop_survives_garbage_and_says_so_in_healthz(
    hostile: HostileRuntime,
) -> None:
    async with exporter(hostile) as (e, url):
        await _until(lambda: e.poller.rounds >= 1)
        hostile.answer("ListDevices", NOT_PROTOBUF)
        await _until(lambda: "runtime" in e.poller.problems)
        status, text = await _get(url + "/healthz")
        assert status == 200, text
        assert "degraded" in text, text
        assert "DeviceService.ListDevices" in text, text
        assert e.failed is None
        _, metrics = await _get(url + "/metrics")
        assert 'source="runtime_invalid_reply"' in metrics
        assert "lj_runtimekit_runtime_up" in metrics
        # and it recovers by itself
        hostile.answer("ListDevices", gpus())
        await _until(lambda: "runtime" not in e.poller.problems, 60)
        status, text = await _get(url + "/healthz")
        assert text.strip() == "ok"


async def test_garbage_metrics_keep_the_device_series(hostile: HostileRuntime) -> None:
    hostile.answer("GetDeviceMetrics", NOT_PROTOBUF)
    async with exporter(hostile) as (e, url):
        await _until(lambda: "runtime" in e.poller.problems)
        _, text = await _get(url + "/healthz")
        assert "MonitorService.GetDeviceMetrics" in text, text
        _, metrics = await _get(url + "/metrics")
        assert 'device="gpu-0"' in metrics


async def test_garbage_from_pod_resources_falls_back_and_says_so(
    hostile: HostileRuntime, tmp_path: Path
) -> None:
    # a pod-resources socket that answers List with bytes that are not its message
    sock = str(tmp_path / "kubelet.sock")

    server = await serve_bytes(sock, "v1.PodResourcesLister", "List", NOT_PROTOBUF)
    try:
        pr = PodResources(sock, 1.0)
        await pr.start()
        with pytest.raises(PodResourcesUnavailable, match="not a ListPodResourcesResponse"):
            await pr.held()
        await pr.stop()
        async with exporter(hostile, pod_resources_socket=sock) as (e, url):
            await _until(lambda: "pod_resources" in e.poller.problems)
            status, text = await _get(url + "/healthz")
            assert status == 200, text
            assert "not a ListPodResourcesResponse" in text, text
            assert e.failed is None
    finally:
        await server.stop(None)


# --- metric values at their extremes: the exposition always parses --------------------------

odd = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-1.0, 0.0, 1e308, -1e308, 5e-324, math.nan, math.inf]),
)
u64s = st.one_of(st.sampled_from([0, U64, 1 << 63]), st.integers(0, U64))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    samples=st.lists(
        st.builds(
            monitor_pb2.DeviceMetrics,
            device_id=st.sampled_from(["gpu-0", "gpu-1", "gpu-0", "", 'q"\\\n']),
            utilization_ratio=odd,
            memory_used_bytes=u64s,
            memory_total_bytes=u64s,
            temperature_celsius=odd,
            power_watts=odd,
            energy_joules_total=odd,
        ),
        max_size=4,
    ),
    memory=u64s,
)
async def test_runtime_metrics_at_extremes_give_a_valid_exposition_over_the_wire(
    hostile: HostileRuntime, samples: list[monitor_pb2.DeviceMetrics], memory: int
) -> None:
    hostile.answer(
        "ListDevices",
        device_pb2.ListDevicesResponse(
            devices=[
                device_pb2.Device(id="gpu-0", memory_bytes=memory),
                device_pb2.Device(id="gpu-0", memory_bytes=1),
            ]
        ),
    )
    hostile.answer("GetDeviceMetrics", metrics_reply(*samples))
    async with RuntimeClient(str(hostile.socket_dir), 2.0) as client:
        state = await client.read(await client.version())
    st_ = State(node="n1", pods_source="none")
    st_.snapshot = Snapshot(node="n1", taken_at=1.0, runtime=state, pods=None, pods_up=False)
    text = Exposition(st_).body(False).decode()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, f"duplicate series {key}"
            seen.add(key)
            assert not math.isnan(s.value), s
            assert not math.isinf(s.value), s


# --- the process: a poll loop that ends on an error ends the process with 1 ------------------


async def test_a_poll_loop_that_fails_exits_1_not_0(
    hostile: HostileRuntime, tmp_path: Path
) -> None:
    # an error the poll loop does not expect (here: the clock the snapshot is stamped with
    # fails): the loop ends, and so must the process, non-zero, so the pod restarts
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, time\n"
        "from lj_runtimekit_exporter import poller\n"
        "calls = []\n"
        "def clock():\n"
        "    calls.append(1)\n"
        "    if len(calls) > 2: raise RuntimeError('clock broke')\n"
        "    return time.time()\n"
        "orig = poller.Poller.__init__\n"
        "def init(self, *a, **kw):\n"
        "    kw['clock'] = clock\n"
        "    orig(self, *a, **kw)\n"
        "poller.Poller.__init__ = init\n"
        "from lj_runtimekit_exporter.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script),
        "--socket-dir", str(hostile.socket_dir), "--port", "0", "--listen-address", "127.0.0.1",
        "--pods-source", "none", "--poll-interval", "0.1", "--log-format", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NODE_NAME": "n1"},
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.communicate()
        pytest.fail("the exporter kept running with its poll loop dead")
    assert proc.returncode == 1, out.decode()
    assert b"exporter_failed" in out


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe", b'{"items": []' + b" " * (64 << 20) + b"}"],
    ids=["deep", "non-utf8", "huge"],
)
async def test_a_bad_kubelet_pods_answer_is_pods_unavailable(body: bytes) -> None:
    async def pods(_: web.Request) -> web.Response:
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    source = KubeletPods(f"http://127.0.0.1:{runner.addresses[0][1]}/pods", 10.0)
    await source.start()
    try:
        with pytest.raises(PodsUnavailable):
            await source.pods()
    finally:
        await source.stop()
        await runner.cleanup()


async def test_a_pod_list_sent_in_many_chunks_is_read_whole() -> None:
    """``content.read(n)`` returns what has arrived so far: a pod list longer than one network
    chunk was cut short and read as garbage (seen with the device plugin's copy on a real node)."""
    pods = [
        {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}", "note": "x" * 2000},
         "status": {"phase": "Running"}}
        for i in range(50)
    ]  # fmt: skip
    body = json.dumps({"kind": "PodList", "items": pods}).encode()

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for at in range(0, len(body), 4096):
            await response.write(body[at : at + 4096])
            await asyncio.sleep(0.001)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/pods", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    source = KubeletPods(f"http://127.0.0.1:{runner.addresses[0][1]}/pods", 10.0)
    await source.start()
    try:
        got = await source.pods()
    finally:
        await source.stop()
        await runner.cleanup()
    assert len(got) == 50
