"""Fixtures of the controller's cluster tests: an in-process controller on the harness cluster."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

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


def agent_result(action: str, node: str, succeeded: bool = True, **fields: Any) -> str:
    """The job agent's result as it writes it to /dev/termination-log (see the job agent's
    result.py; not imported: components are independent)."""
    data = {
        "action": action,
        "node": node,
        "succeeded": succeeded,
        "reason": ("Enabled" if action == "enable" else "Disabled") if succeeded else "Failed",
        "message": f"{action}d by the stand-in kubelet's agent" if succeeded else "agent failed",
        "agent_version": "1.13.0",
        "runtime_changed": True,
        "containerd_changed": True,
        "containerd_restarted": True,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
    }
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


Ending = tuple[str, int, str]
"""A pod's end as the stand-in kubelet reports it: phase, the agent's exit code, its message."""


def runs_the_agent(action: str, node: str) -> Ending:
    return "Succeeded", 0, agent_result(action, node)


@dataclass
class StandInKubelet:
    """Plays the kubelet's part for nodes KWOK does not manage (no ``kwok.x-k8s.io/node``
    annotation): each agent pod bound to one of them ends at once as its behaviour says, with the
    agent's result in the agent container's termination message — the one thing a KWOK stage
    cannot write, and the only thing the controller takes as proof that the agent ran."""

    api: client.ApiClient
    namespace: str
    run_label: str
    behaviour: dict[str, Callable[[str, str], Ending]] = field(default_factory=dict)
    ended: int = 0
    agent_result = staticmethod(agent_result)
    _done: set[str] = field(default_factory=set)
    args: dict[str, list[list[str]]] = field(default_factory=dict)
    """node → the agent args of each Job pod it ended, in order."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def nodes(self, n: int, enable: bool, prefix: str = "agent") -> list[str]:
        core = client.CoreV1Api(self.api)
        made = [f"{prefix}-{uuid.uuid4().hex[:6]}-{i}" for i in range(n)]
        for name in made:
            labels = {"lj-test/run": self.run_label}
            if len(name) <= 63:  # a label value's limit
                labels["kubernetes.io/hostname"] = name
            if enable:
                labels["lj_runtimekit_enable"] = "true"
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels)))
            self.behaviour[name] = runs_the_agent
        return made

    def _end(self, core: client.CoreV1Api, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        node = spec.node_name or ""
        if node not in self.behaviour or meta.uid in self._done or meta.deletion_timestamp:
            return
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            return
        args = spec.containers[0].args or []
        self.args.setdefault(node, []).append(list(args))
        phase, code, message = self.behaviour[node](args[0] if args else "", node)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed" if code == 0 else "Error",
                        "message": message,
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
            for c in spec.containers
        ]
        body = {"status": {"phase": phase, "startTime": now, "containerStatuses": statuses}}
        try:
            core.patch_namespaced_pod_status(meta.name, self.namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise
        self._done.add(meta.uid)
        self.ended += 1

    def run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            listing = core.list_namespaced_pod(self.namespace)
            for pod in listing.items:
                self._end(core, pod)
            rv = listing.metadata.resource_version if listing.metadata else None
            w = watch.Watch()  # type: ignore[no-untyped-call]
            with contextlib.suppress(ApiException):
                while not self._stop.is_set():
                    for event in w.stream(  # type: ignore[no-untyped-call]
                        core.list_namespaced_pod,
                        self.namespace,
                        resource_version=rv,
                        timeout_seconds=1,
                    ):
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._end(core, event["object"])
                        rv = event["object"].metadata.resource_version
                        if self._stop.is_set():
                            break


@pytest.fixture
def kubelet(cluster: Any, namespace: str, run_label: str) -> Iterator[StandInKubelet]:
    """A :class:`StandInKubelet` for the test's namespace; its nodes are deleted afterwards."""
    api = cluster.api_client()
    stand_in = StandInKubelet(api, namespace, run_label)
    thread = threading.Thread(target=stand_in.run, daemon=True, name="stand-in-kubelet")
    thread.start()
    try:
        yield stand_in
    finally:
        stand_in._stop.set()
        thread.join(10)
        core = client.CoreV1Api(api)
        for name in stand_in.behaviour:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
        api.close()


@pytest.fixture
def run_label(namespace: str) -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def start_controller(
    cluster: Any, namespace: str, run_label: str
) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    started: list[Running] = []
    # What deploy/ creates beside the controller: the agent's own ServiceAccount, which the Job
    # template names (the Job controller creates no pod without it).
    api = cluster.api_client()
    with contextlib.suppress(ApiException):  # 409: already there
        client.CoreV1Api(api).create_namespaced_service_account(
            namespace,
            client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=names.AGENT_SERVICE_ACCOUNT)),
        )
    api.close()

    async def start(**overrides: Any) -> Running:
        values: dict[str, Any] = {
            "job_image": "registry.local/lj-runtimekit-controller-job-agent:v1.13.0",
            "namespace": namespace,
            "kubeconfig": cluster.kubeconfig,
            "metrics_bind_address": "127.0.0.1:0",
            "node_selector": f"lj-test/run={run_label}",
            "job_priority_class": "",
            "retry_backoff": 1.0,
            "leader_elect_resource_namespace": namespace,
            "leader_elect_lease_duration": 4.0,
            "leader_elect_renew_deadline": 3.0,
            "leader_elect_retry_period": 0.5,
            "identity": f"replica-{len(started)}",
            "log_format": "text",
            "kube_api_qps": 200.0,
            "kube_api_burst": 400,
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
