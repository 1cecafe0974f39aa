"""Fixtures of the controller's cluster tests: an in-process controller on the harness cluster."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from lj_runtimekit_controller import names, status
from lj_runtimekit_controller.app import Controller
from lj_runtimekit_controller.settings import Settings

EXIT_CODE_ANNOTATION = "lj-runtimekit-testkit/exit-code"


@dataclass
class Running:
    controller: Controller
    task: asyncio.Task[int]

    async def stop(self) -> int:
        self.controller.stop.set()
        return await asyncio.wait_for(self.task, 30)


@dataclass
class JobWatcher:
    """Records, from a watch, how many agent Jobs exist per node and cluster-wide at once."""

    api: client.ApiClient
    namespace: str
    live: dict[str, str] = field(default_factory=dict)
    peak_per_node: int = 0
    peak_total: int = 0
    created: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        # Polling the list: a watch restarted without its resourceVersion would miss deletions.
        batch = client.BatchV1Api(self.api)
        seen: set[str] = set()
        while not self._stop.is_set():
            items = batch.list_namespaced_job(self.namespace).items
            self.live = {
                str(j.metadata.name): (j.metadata.annotations or {}).get(names.NODE_KEY, "")
                for j in items
                if j.metadata is not None
            }
            seen.update(str(j.metadata.uid) for j in items if j.metadata is not None)
            self.created = len(seen)
            per_node: dict[str, int] = {}
            for n in self.live.values():
                per_node[n] = per_node.get(n, 0) + 1
            self.peak_per_node = max([self.peak_per_node, *per_node.values()])
            self.peak_total = max(self.peak_total, len(self.live))
            time.sleep(0.05)


@pytest.fixture
def run_label(namespace: str) -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def start_controller(
    cluster: Any, namespace: str, run_label: str
) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    started: list[Running] = []

    async def start(**overrides: Any) -> Running:
        values: dict[str, Any] = {
            "job_image": "registry.local/lj-runtimekit-controller-job-agent:v1.13.0",
            "namespace": namespace,
            "kubeconfig": cluster.kubeconfig,
            "port": 0,
            "listen_address": "127.0.0.1",
            "node_selector": f"lj-test/run={run_label}",
            "job_priority_class": "",
            "retry_backoff": 1.0,
            "lease_duration": 4.0,
            "renew_deadline": 3.0,
            "retry_period": 0.5,
            "identity": f"replica-{len(started)}",
            "log_format": "console",
            "api_qps": 200.0,
            "api_burst": 400,
        }
        values.update(overrides)
        controller = Controller(Settings(**values))
        running = Running(controller, asyncio.create_task(controller.run()))
        started.append(running)
        return running

    try:
        yield start
    finally:
        for r in started:
            if not r.task.done():
                with contextlib.suppress(Exception):
                    await r.stop()


@pytest.fixture
def job_watcher(cluster: Any, namespace: str) -> Any:
    api = cluster.api_client()
    watcher = JobWatcher(api, namespace)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    yield watcher
    watcher._stop.set()
    thread.join(10)
    api.close()


@dataclass
class Probe:
    """Reads the cluster from the test's side (sync client, in a thread)."""

    core: client.CoreV1Api
    batch: client.BatchV1Api
    namespace: str
    run_label: str
    exit_code_annotation: str = EXIT_CODE_ANNOTATION

    async def poll(self, check: Callable[[], Any], deadline_s: float = 60.0, what: str = "") -> Any:
        """``check()`` in a thread until it returns something truthy; fails at the deadline."""
        end = time.monotonic() + deadline_s
        last: Any = None
        while time.monotonic() < end:
            last = await asyncio.to_thread(check)
            if last:
                return last
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out after {deadline_s}s waiting for {what}: {last!r}")

    def status(self, node: str) -> status.Status | None:
        ann = self.core.read_node(node).metadata.annotations or {}  # type: ignore[union-attr]
        return status.parse(ann.get(names.STATUS_ANNOTATION))

    def events(self, node: str, reason: str) -> list[Any]:
        items = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}"
        ).items
        return [e for e in items if e.reason == reason]

    def jobs(self, node: str | None = None) -> list[Any]:
        items: list[Any] = self.batch.list_namespaced_job(self.namespace).items
        return [
            j
            for j in items
            if node is None or (j.metadata.annotations or {}).get(names.NODE_KEY) == node
        ]

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace).items)

    def label(self, node: str, value: str | None) -> None:
        body = {"metadata": {"labels": {"lj_runtimekit_enable": value}}}
        self.core.patch_node(node, body)

    async def nodes(self, cluster: Any, n: int, enable: bool, prefix: str = "ctl") -> list[str]:
        labels = {"lj-test/run": self.run_label}
        made: list[str] = await asyncio.to_thread(
            cluster.create_gpu_nodes, n, prefix, 8, labels, enable=enable
        )
        return made


@pytest.fixture
def probe(cluster: Any, namespace: str, run_label: str) -> Any:
    api = cluster.api_client()
    yield Probe(client.CoreV1Api(api), client.BatchV1Api(api), namespace, run_label)
    api.close()
