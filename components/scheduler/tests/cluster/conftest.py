"""Fixtures of the scheduler's cluster tests: the NodeDevices CRD, GPU nodes with their
inventory, and our scheduler running in-process against the real apiserver."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from lj_runtimekit_scheduler import app, lifecycle
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_testkit.cluster.crds import installed_crd

CRD = Path(__file__).parents[4] / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
GROUP, VERSION, PLURAL = "lj-runtimekit.aliyun.com", "v1", "nodedevices"
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"


def eventually(what: str, check: Callable[[], Any], deadline_s: float = 60.0) -> Any:
    deadline = time.monotonic() + deadline_s
    interval = 0.05
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s:.0f} s")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.5)
    return result


async def until(what: str, check: Callable[[], Any], deadline_s: float = 60.0) -> Any:
    """Poll ``check`` (run in a thread: the sync client must not block the scheduler's loop)."""
    deadline = time.monotonic() + deadline_s
    interval = 0.05
    while not (result := await asyncio.to_thread(check)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s:.0f} s")
        await asyncio.sleep(interval)
        interval = min(interval * 1.5, 0.5)
    return result


class GpuCluster:
    """The session cluster, plus what these tests need on it."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.api = cluster.api_client()
        # Any: these tests hand raw dicts to the typed client
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.tag = uuid.uuid4().hex[:6]

    def gpu_nodes(
        self, n: int, gpus: int = 8, islands: int = 2, *, advertised: bool = True, **kw: Any
    ) -> list[str]:
        """KWOK nodes labelled for us, each with a NodeDevices inventory of ``gpus`` GPUs;
        ``advertised``: the node has them as extended resources (a node in DRA mode has not)."""
        labels = {"sched-test": self.tag, **kw.pop("labels", {})}
        names: list[str] = self.cluster.create_gpu_nodes(
            n,
            prefix=f"s{self.tag}",
            gpus=gpus if advertised else 0,
            labels=labels,
            enable=True,
            **kw,
        )
        per = max(1, gpus // islands)
        for name in names:
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "NodeDevices",
                "metadata": {"name": name},
                "spec": {"nodeName": name},
            }
            obj = self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
            obj["status"] = {
                "deviceCount": gpus,
                "healthyCount": gpus,
                "devices": [
                    {
                        "id": f"gpu-{i}",
                        "kind": "GPU",
                        "index": i,
                        "memoryBytes": 80 * 2**30,
                        "healthy": True,
                        "numaNode": i // per,
                        "nvlinkIsland": i // per,
                    }
                    for i in range(gpus)
                ],
            }
            self.custom.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, obj)
        return names

    def pod(
        self,
        name: str,
        limits: dict[str, str] | None = None,
        *,
        scheduler: str = "lj-runtimekit-scheduler",
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        **spec: Any,
    ) -> str:
        res = {"requests": limits, "limits": limits} if limits else {}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
            "spec": {
                "schedulerName": scheduler,
                "restartPolicy": "Never",
                "nodeSelector": {"sched-test": self.tag},
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                "containers": [{"name": "main", "image": "busybox", "resources": res}],
                **spec,
            },
        }
        self.core.create_namespaced_pod(self.namespace, body)
        return name

    def node_of(self, name: str) -> str | None:
        return self.core.read_namespaced_pod(name, self.namespace).spec.node_name or None

    async def until(self, what: str, check: Callable[[], Any], deadline_s: float = 60) -> Any:
        return await until(what, check, deadline_s)

    def nodes_of(self, names: list[str]) -> dict[str, str | None]:
        return {n: self.node_of(n) for n in names}

    async def wait_bound(self, names: list[str], deadline_s: float = 60) -> dict[str, str]:
        def check() -> dict[str, str | None] | None:
            r = self.nodes_of(names)
            return r if all(r.values()) else None

        return dict(await until(f"pods {names} bound", check, deadline_s))

    def assignment(self, name: str) -> dict[str, Any]:
        pod = self.core.read_namespaced_pod(name, self.namespace)
        return dict(json.loads(pod.metadata.annotations[ASSIGNMENT]))

    def refused(self, name: str, text: str = "") -> bool:
        """The pod's scheduler recorded FailedScheduling for it (with ``text`` in the message)."""
        return any(e.startswith("FailedScheduling:") and text in e for e in self.events(name))

    async def wait_refused(self, names: list[str], text: str = "", deadline_s: float = 60) -> None:
        """Until one of ``names`` was refused with ``text``: the moment at which "it stays
        pending" means the scheduler decided so (a fixed sleep also passes a scheduler that is
        only slow)."""
        await until(
            f"FailedScheduling {text!r} on one of {names}",
            lambda: any(self.refused(n, text) for n in names) or None,
            deadline_s,
        )

    async def wait_decided(self, names: list[str], deadline_s: float = 60) -> None:
        """Until every pod of ``names`` is bound or refused by its scheduler."""
        await until(
            f"pods {names} bound or refused",
            lambda: all(self.node_of(n) or self.refused(n) for n in names) or None,
            deadline_s,
        )

    def events(self, name: str) -> list[str]:
        evs = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [f"{e.reason}: {e.message}" for e in evs.items]


@pytest.fixture(scope="module")
def nodedevices_crd(cluster: Any) -> Iterator[None]:
    """The NodeDevices CRD as deploy/ ships it, for the test file (deleted after it)."""
    with installed_crd(cluster, CRD):
        yield


@pytest.fixture
def gpu_cluster(cluster: Any, namespace: str, nodedevices_crd: None) -> Iterator[GpuCluster]:
    g = GpuCluster(cluster, namespace)
    try:
        yield g
    finally:
        g.api.close()  # its pooled connections, else they warn when collected in a later test


@pytest.fixture
async def scheduler(
    cluster: Any, gpu_cluster: GpuCluster
) -> AsyncIterator[Callable[..., asyncio.Task[None]]]:
    """Start our scheduler in-process: ``scheduler(**settings)`` returns its task."""
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    def start(**kw: Any) -> asyncio.Task[None]:
        kw.setdefault("leader_elect", False)
        cfg = Settings(kubeconfig=cluster.kubeconfig, metrics_bind_address="127.0.0.1:0", **kw)
        tasks = lifecycle.Tasks()
        task = asyncio.create_task(app.serve(cfg, tasks))
        running.append((tasks.stop, task))
        return task

    yield start
    for stop, _ in running:
        stop.set()
    for _, task in running:
        try:
            await asyncio.wait_for(task, 20)
        except TimeoutError:
            task.cancel()
        except asyncio.CancelledError:
            pass  # a test killed this replica on purpose
    # what a replica left unclosed (a socket, a task) warns here, in the test that ran it, and
    # not in whichever later test the garbage collector happens to run in
    gc.collect()
