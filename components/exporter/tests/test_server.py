"""The HTTP surface on a real port: formats by Accept, /healthz, no I/O in a scrape."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from lj_runtimekit_exporter import server
from lj_runtimekit_exporter.collector import State
from lj_runtimekit_exporter.snapshot import Device, DeviceSample, RuntimeState, Snapshot

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, State, list[bool]]]:
    rt = RuntimeState(
        "v1.13.0",
        "v1",
        (Device("gpu-0", "GPU-a", 0, "gpu", "H800"),),
        (DeviceSample("gpu-0", utilization_ratio=0.5),),
        (),
        (),
    )
    state = State(node="n", pods_source="none", snapshot=Snapshot("n", time.time(), rt, None))
    alive = [True]
    app = server.create_app(state, lambda: (alive[0], "ok" if alive[0] else "poll loop stopped"))
    runner, port = await server.start(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", state, alive
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("accept", "content_type", "eof"),
    [
        ("", "text/plain; version=0.0.4; charset=utf-8", False),
        ("text/plain", "text/plain; version=0.0.4; charset=utf-8", False),
        (PROMETHEUS_ACCEPT, "application/openmetrics-text; version=1.0.0; charset=utf-8", True),
    ],
    ids=["none", "text", "prometheus-default"],
)
async def test_metrics_format_follows_the_accept_header(
    served: tuple[str, State, list[bool]], accept: str, content_type: str, eof: bool
) -> None:
    url, state, _ = served
    headers = {"Accept": accept}
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", headers=headers) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == content_type
        body = await r.text()
    assert 'lj_runtimekit_device_utilization_ratio{node="n",device="gpu-0"' in body
    assert body.endswith("# EOF\n") == eof
    assert state.stats.scrapes == 1


async def test_healthz_reports_the_poll_loop(served: tuple[str, State, list[bool]]) -> None:
    url, _, alive = served
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/healthz") as r:
            assert r.status == 200
        alive[0] = False
        async with s.get(url + "/healthz") as r:
            assert r.status == 503
            assert "poll loop stopped" in await r.text()
