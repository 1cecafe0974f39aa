"""Fixtures of the exporter's tests: snapshots for units, a real Prometheus for integration."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit_exporter.app import Exporter
from lj_runtimekit_exporter.settings import Settings

REPO = Path(__file__).resolve().parents[3]
Series = list[tuple[dict[str, str], float]]


class RunningExporter:
    """An exporter serving on a loopback port; ``scrape()`` reads /metrics like Prometheus."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self.url = f"http://127.0.0.1:{exporter.port}"
        self._session = aiohttp.ClientSession()

    async def text(self, accept: str = "") -> str:
        async with self._session.get(self.url + "/metrics", headers={"Accept": accept}) as r:
            assert r.status == 200
            return await r.text()

    async def scrape(self) -> dict[str, Series]:
        out: dict[str, Series] = {}
        for family in text_string_to_metric_families(await self.text()):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    async def wait_for(
        self, ok: Callable[[dict[str, Series]], bool], deadline_s: float = 20.0
    ) -> dict[str, Series]:
        """Scrapes until ``ok(series)``; fails with the last scrape's names at the deadline."""
        end = time.monotonic() + deadline_s
        got: dict[str, Series] = {}
        while time.monotonic() < end:
            got = await self.scrape()
            if ok(got):
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"condition not met after {deadline_s}s; series: {sorted(got)}")

    async def close(self) -> None:
        await self._session.close()


@pytest.fixture
async def exporter_factory() -> AsyncIterator[Callable[..., Awaitable[RunningExporter]]]:
    """``await exporter_factory(socket_dir=..., pods_source="none", **settings)``: started."""
    started: list[RunningExporter] = []

    async def start(**overrides: Any) -> RunningExporter:
        values: dict[str, Any] = {
            "node_name": "node-a",
            "metrics_bind_address": "127.0.0.1:0",
            "poll_interval": 0.1,
            "pods_source": "none",
        }
        values.update(overrides)
        exporter = Exporter(Settings(**values))
        await exporter.start()
        running = RunningExporter(exporter)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.close()
        await running.exporter.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A real Prometheus on loopback with its own config and storage."""

    def __init__(self, binary: str, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: lj-runtimekit-exporter\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read()) if path.startswith("/api") else r.read()

    async def wait_ready(self, deadline_s: float = 60.0) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._get, "/-/ready")
                return
            await asyncio.sleep(0.2)
        raise TimeoutError("prometheus not ready")

    async def query(self, promql: str) -> list[dict[str, Any]]:
        path = "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        doc = await asyncio.to_thread(self._get, path)
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    async def wait_for(
        self, promql: str, ok: Callable[[list[dict[str, Any]]], bool], deadline_s: float = 60.0
    ) -> list[dict[str, Any]]:
        """Polls ``promql`` until ``ok(result)``; fails with the last result at the deadline."""
        end = time.monotonic() + deadline_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < end:
            result = await self.query(promql)
            if ok(result):
                return result
            await asyncio.sleep(0.25)
        raise AssertionError(f"{promql}: still {result} after {deadline_s}s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    tool = REPO / "tests" / "tools" / "debian-tool.sh"
    out = subprocess.run(
        [str(tool), "prometheus", "usr/bin/prometheus"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        pytest.fail(f"cannot get Debian's prometheus: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
async def prometheus_factory(
    prometheus_binary: str, tmp_path: Path
) -> AsyncIterator[Callable[[list[str]], Awaitable[Prometheus]]]:
    started: list[Prometheus] = []

    async def start(targets: list[str]) -> Prometheus:
        p = Prometheus(prometheus_binary, tmp_path / f"prom{len(started)}", targets)
        started.append(p)
        await p.wait_ready()
        return p

    for d in range(3):
        (tmp_path / f"prom{d}").mkdir()
    yield start
    for p in started:
        p.stop()
